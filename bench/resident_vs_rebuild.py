"""Resident engine against rebuilding it, per KV-cache mode, with CUDA graphs on and off (GPU only).

A resident loop hands off with ``suspend + drain + barrier`` before training and ``drain + barrier + resume``
after; a loop that rebuilt the engine at every boundary (say, each validation) would instead shut it down
and build it again: construction, KV allocation, CUDA-graph capture. Both do one (untimed) train step on the
same model in between, and the first generation after the handoff is timed too. Graphs on: a model with
``cuda_graph_impl="local"`` and ``num_cuda_graphs`` pre-captured graphs; graphs off: an eager model.

    python bench/resident_vs_rebuild.py --out bench/results/resident_vs_rebuild.json     # GPU, ~1-2 min
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository, for bench.* and colo_fsm
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _gpu as g  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/resident_vs_rebuild.json")
    ap.add_argument("--modes", default="persist,offload,recompute")
    ap.add_argument("--graphs", default="off,on")
    ap.add_argument("--cycles", type=int, default=5, help="resident suspend/resume cycles (eager)")
    ap.add_argument("--graph-cycles", type=int, default=3, help="resident cycles with graphs")
    ap.add_argument("--rebuilds", type=int, default=3, help="rebuild cycles (eager)")
    ap.add_argument("--graph-rebuilds", type=int, default=2, help="rebuild cycles with graphs")
    ap.add_argument("--num-cuda-graphs", type=int, default=16)
    ap.add_argument("--scope", default="layer", choices=("layer", "block"), help="inference_cuda_graph_scope")
    ap.add_argument("--buffer-gb", type=float, default=4.0)
    ap.add_argument("--max-requests", type=int, default=64)
    args = ap.parse_args(argv)

    import torch

    g.quiet_logs()
    if not torch.cuda.is_available():
        print("resident_vs_rebuild: needs a GPU (megatron-core's dynamic engine); nothing measured here")
        return 0
    shape = g.GPTShape()
    g.setup("cuda")
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig
    from colo_fsm.guards.barrier import TorchBarrier
    from colo_fsm.guards.drain import DeviceDrain

    tok = CharTokenizer()
    drain = DeviceDrain(0)
    barrier = TorchBarrier()
    res = g.Results(
        args.out,
        bench="resident_vs_rebuild",
        command=" ".join(["python", "bench/resident_vs_rebuild.py", *(argv if argv is not None else sys.argv[1:])]),
        machine=g.machine_info("cuda"),
        shape=g.asdict(shape),
        options=vars(args),
    )
    models: dict[bool, Any] = {}
    want = [x == "on" for x in args.graphs.split(",")]
    # the graphs model first: it installs the inference RNG tracker the eager model can live with
    for graphs in sorted(set(want), reverse=True):
        models[graphs] = g.build_gpt(shape, "cuda", graphs=graphs, scope=args.scope, reset_rng=not models)
    batch = g.rollouts(8, [224])  # 8 x 256 tokens
    warm_prompts = g.prompts(8, 32, seed=3)
    rows = []

    for graphs in want:
        model = models[graphs]
        trainer = MegatronTrainer(model, TrainerConfig(lr=1e-5))
        for mode in args.modes.split(","):
            name = f"{mode}/graphs_{'on' if graphs else 'off'}"
            with res.section(name) as out:
                opts = g.EngineOptions(
                    mode=mode,
                    buffer_gb=args.buffer_gb,
                    max_requests=args.max_requests,
                    max_sequence_length=shape.seq,
                    num_cuda_graphs=args.num_cuda_graphs if graphs else None,
                )
                eng = g.BenchEngine(model, tok, opts)
                out["initial_build"] = eng.build
                eng.generate(warm_prompts, 16)
                out["mem_awake"] = g.mem_snapshot("awake")
                resident = []
                for _ in range(args.graph_cycles if graphs else args.cycles):
                    t0 = time.perf_counter()
                    eng.suspend()
                    drain()
                    barrier.wait(state="Draining")
                    t1 = time.perf_counter()
                    mem_s = g.mem_snapshot("suspended")
                    trainer.restore_buffers()
                    trainer.train_step(batch)
                    trainer.offload_buffers()
                    t2 = time.perf_counter()
                    drain()
                    barrier.wait(state="Resuming")
                    eng.resume()
                    t3 = time.perf_counter()
                    eng.generate(warm_prompts, 16)
                    g.sync()
                    t4 = time.perf_counter()
                    resident.append(
                        {
                            "suspend_drain_barrier_s": t1 - t0,
                            "drain_barrier_resume_s": t3 - t2,
                            "first_generate_8x16_s": t4 - t3,
                            "suspended_allocated_gib": mem_s["allocated_gib"],
                        }
                    )
                out["resident"] = resident
                rebuild = []
                for _ in range(args.graph_rebuilds if graphs else args.rebuilds):
                    t0 = time.perf_counter()
                    eng.shutdown(graphs=graphs)
                    drain()
                    barrier.wait(state="Draining")
                    t1 = time.perf_counter()
                    mem_s = g.mem_snapshot("shut down")
                    trainer.restore_buffers()
                    trainer.train_step(batch)
                    trainer.offload_buffers()
                    t2 = time.perf_counter()
                    drain()
                    barrier.wait(state="Resuming")
                    eng = g.BenchEngine(model, tok, opts)
                    t3 = time.perf_counter()
                    eng.generate(warm_prompts, 16)
                    g.sync()
                    t4 = time.perf_counter()
                    rebuild.append(
                        {
                            "shutdown_drain_barrier_s": t1 - t0,
                            "drain_barrier_build_s": t3 - t2,
                            "build": eng.build,
                            "first_generate_8x16_s": t4 - t3,
                            "shut_down_allocated_gib": mem_s["allocated_gib"],
                        }
                    )
                out["rebuild"] = rebuild
                out["mem_end"] = g.mem_snapshot("end")
                eng.shutdown(graphs=graphs)
                out["summary"] = summarize_one(resident, rebuild)
                rows.append({"mode": mode, "graphs": "on" if graphs else "off", **out["summary"]})
    res.data["table"] = rows
    res.flush()
    cols = [
        "mode",
        "graphs",
        "suspend_ms",
        "resume_ms",
        "resident_first_gen_ms",
        "shutdown_ms",
        "build_ms",
        "capture_ms",
        "rebuild_first_gen_ms",
        "rebuild_over_resume",
        "rebuild_over_handoff",
    ]
    print(g.table(rows, cols))
    print(f"wrote {args.out}")
    return g.failed_sections(res.data)


def summarize_one(resident: list[dict[str, Any]], rebuild: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians in ms and the two ratios (rebuild over the resume side, rebuild over the whole handoff)."""

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        v = g.median([r[key] for r in rows])
        return None if v is None else 1000 * v

    sus = med(resident, "suspend_drain_barrier_s")
    resu = med(resident, "drain_barrier_resume_s")
    shut = med(rebuild, "shutdown_drain_barrier_s")
    build = med(rebuild, "drain_barrier_build_s")
    cap = g.median([r["build"]["engine_init_incl_graph_capture_s"] for r in rebuild])
    out = {
        "suspend_ms": sus,
        "resume_ms": resu,
        "resident_first_gen_ms": med(resident, "first_generate_8x16_s"),
        "shutdown_ms": shut,
        "build_ms": build,
        "capture_ms": None if cap is None else 1000 * cap,
        "rebuild_first_gen_ms": med(rebuild, "first_generate_8x16_s"),
    }
    if resu and build is not None:
        out["rebuild_over_resume"] = build / resu
    if sus is not None and resu and shut is not None and build is not None:
        out["rebuild_over_handoff"] = (shut + build) / (sus + resu)
    return out


if __name__ == "__main__":
    sys.exit(main())
