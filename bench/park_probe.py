"""Requests in flight across suspend -> train -> resume through colo-fsm's own adapter, in every KV mode (GPU).

For each KV mode a fresh ~200M GPT (``ModelConfig(cuda_graphs=...)``) and a ``MegatronEngine``
(``GenerationConfig(num_cuda_graphs=...)``, ``inflight="park"``; eager where colo-fsm refuses graphs for parking in
that mode, offload, as ``graphs_refused`` records): 24 requests with heavy-tailed lengths
(16..1024 tokens) are submitted, the engine is suspended after ``--park-after`` decode steps with requests
still running, one train step runs on the same model, the weight version moves on, the engine resumes, and
every request must finish with exactly its requested length, with per-token weight versions spanning the
handoff. The tokenizer's end-of-document id lies outside the model's vocabulary, so nothing stops early.

Then decode speed through the adapter: 16 and 64 greedy requests of 256 tokens (``generate_ids``), with and
without CUDA graphs, and whether the two produce the same tokens on the same weights.

    python bench/park_probe.py --out bench/results/park_probe.json            # GPU, ~1-2 min

A failed section makes it exit 1.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository, for bench.* and colo_fsm
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _gpu as g  # noqa: E402


def build(args: argparse.Namespace, tok: Any, graphs: bool) -> Any:
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model

    small = args.device == "cpu"  # CPU smoke run of the same steps (no dynamic engine, no graphs)
    return build_model(
        ModelConfig(
            vocab_size=tok.vocab_size,
            hidden_size=64 if small else 1024,
            num_layers=2 if small else 16,
            num_attention_heads=4 if small else 16,
            max_sequence_length=2048,
            device=args.device,
            cuda_graphs=graphs and not small,
            cuda_graph_scope=args.scope,
        )
    )


def engine_for(model: Any, tok: Any, mode: str, graphs: bool, args: argparse.Namespace, version: Any) -> Any:
    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine

    return MegatronEngine(
        model,
        tok,
        GenerationConfig(
            kv_cache_mode=mode,
            buffer_size_gb=args.buffer_gb,
            num_cuda_graphs=args.num_cuda_graphs if graphs else None,
            max_active_requests=64,
            max_requests=64,
        ),
        weight_version=version,
    )


def graphs_refused(mode: str, args: argparse.Namespace) -> str | None:
    """Why colo-fsm refuses CUDA graphs for parking in ``mode`` (its ``GenerationConfig``'s own check: the mode
    refused with graphs and accepted without), or None. Any other refusal (an unknown mode, a bad graph count)
    is raised: the section fails rather than running eager unasked."""
    from colo_fsm.adapters.megatron.engine import GenerationConfig
    from colo_fsm.errors import ConfigError

    try:
        GenerationConfig(kv_cache_mode=mode, num_cuda_graphs=args.num_cuda_graphs, inflight="park")
    except ConfigError as exc:
        if exc.field != "kv_cache_mode":
            raise
        GenerationConfig(kv_cache_mode=mode, inflight="park")  # a mode refused outright raises here
        return str(exc)
    return None


def park_mode(mode: str, args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    graphs = args.graphs == "on" and args.device == "cuda"
    refused = graphs_refused(mode, args) if graphs else None
    graphs = graphs and refused is None  # a mode colo-fsm parks only without graphs (offload) runs eager
    model = build(args, tok, graphs)
    trainer = MegatronTrainer(model, TrainerConfig(lr=1e-5))
    v = {"v": 0}
    eng = engine_for(model, tok, mode, graphs, args, lambda: v["v"])
    t = time.perf_counter()
    eng.bring_up()
    up_s = time.perf_counter() - t
    top = 48 if args.device == "cpu" else 1024
    lengths = sorted(g.heavy_tail_lengths(24, 16, top, seed=5, alpha=0.9))
    lengths[-1] = top
    first = threading.Event()
    prompts = g.prompts(24, 16, seed=11, vocab_hi=tok.vocab_size)
    handles = [
        eng.submit(p, max_tokens=n, temperature=1.0, top_k=8, seed=i, on_token=(lambda *_: first.set()))
        for i, (p, n) in enumerate(zip(prompts, lengths))
    ]
    assert first.wait(300), "no token within 300 s"
    while eng.steps < args.park_after and not all(h.done() for h in handles):
        time.sleep(0.002)
    t = time.perf_counter()
    eng.suspend()
    suspend_s = time.perf_counter() - t
    counts = eng.request_counts()
    done_before = sum(h.done() for h in handles)
    steps_at_suspend = eng.steps
    batch = g.rollouts(8, [224], vocab_hi=tok.vocab_size)
    t = time.perf_counter()
    trainer.train_step(batch)
    trainer.offload_buffers()
    g.sync(args.device)
    train_s = time.perf_counter() - t
    v["v"] = 1
    steps_after_train = eng.steps
    t = time.perf_counter()
    trainer.restore_buffers()
    eng.resume()
    resume_s = time.perf_counter() - t
    outs = [h.future.result(timeout=600) for h in handles]
    exact = [len(c.token_ids) == n for c, n in zip(outs, lengths)]
    spans = [c.version_span for c in outs]
    eng.shutdown()
    return {
        "mode": mode,
        "graphs": graphs,
        "graphs_refused": refused,
        "bring_up_s": up_s,
        "requests": len(lengths),
        "lengths": lengths,
        "steps_at_suspend": steps_at_suspend,
        "no_step_during_training": steps_after_train == steps_at_suspend,
        "finished_before_suspend": done_before,
        "counts_at_suspend": {"queued": counts.queued, "running": counts.running, "parked": counts.parked},
        "suspend_ms": 1000 * suspend_s,
        "resume_ms": 1000 * resume_s,
        "train_step_ms": 1000 * train_s,
        "all_exact_length": all(exact),
        "finish_reasons": sorted({c.finish_reason for c in outs}),
        "spanning_requests": sum(1 for s in spans if s > 0),
        "logprobs_match_tokens": all(len(c.logprobs) == len(c.token_ids) for c in outs),
        "pass": all(exact) and counts.parked > 0 and any(s > 0 for s in spans),
    }


def adapter_decode(args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    """Greedy decode tokens/s through ``MegatronEngine.generate_ids``, graphs on vs off, same weights."""
    out: dict[str, Any] = {}
    toks: dict[bool, list[tuple[int, ...]]] = {}
    state = None
    for graphs in (True, False) if args.device == "cuda" else (False,):
        model = build(args, tok, graphs)
        if state is None:
            state = {k: v.clone() for k, v in model.state_dict().items() if v is not None}
        else:
            model.load_state_dict(state, strict=False)
        eng = engine_for(model, tok, "persist", graphs, args, lambda: 0)
        t = time.perf_counter()
        eng.bring_up()
        row: dict[str, Any] = {"bring_up_s": time.perf_counter() - t}
        eng.generate_ids(g.prompts(4, 16, vocab_hi=tok.vocab_size), max_tokens=8)  # warm
        for b in (16, 64):
            ps = g.prompts(b, 32, seed=b, vocab_hi=tok.vocab_size)
            g.sync(args.device)
            t = time.perf_counter()
            res = eng.generate_ids(ps, max_tokens=args.decode_tokens)
            dt = time.perf_counter() - t
            row[f"b{b}_tokens_per_s"] = sum(len(c.token_ids) for c in res) / dt
            row[f"b{b}_s"] = dt
            if b == 16:
                toks[graphs] = [c.token_ids for c in res]
        out["graphs_on" if graphs else "graphs_off"] = row
        eng.shutdown()
        del model, eng
    if True in toks and False in toks:
        out["same_greedy_tokens"] = toks[True] == toks[False]
        out["identical_sequences"] = sum(a == b for a, b in zip(toks[True], toks[False]))
    on, off = out.get("graphs_on", {}), out.get("graphs_off", {})
    for b in (16, 64):
        if on.get(f"b{b}_tokens_per_s") and off.get(f"b{b}_tokens_per_s"):
            out[f"speedup_b{b}"] = on[f"b{b}_tokens_per_s"] / off[f"b{b}_tokens_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/park_probe.json")
    ap.add_argument("--modes", default="persist,offload,recompute")
    ap.add_argument("--graphs", default="on", choices=("on", "off"))
    ap.add_argument("--scope", default="block", choices=("block", "layer"))
    ap.add_argument("--num-cuda-graphs", type=int, default=16)
    ap.add_argument("--buffer-gb", type=float, default=4.0)
    ap.add_argument("--park-after", type=int, default=40, help="decode steps before the suspend")
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a small smoke run")
    args = ap.parse_args(argv)

    import torch

    g.quiet_logs()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("park_probe: needs a GPU (megatron-core's dynamic engine); nothing measured here")
        return 0
    if args.device == "cpu":
        args.decode_tokens = min(args.decode_tokens, 16)
    g.setup(args.device)
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

    tok = CharTokenizer(generates_eod=False)  # nothing stops before its requested length
    res = g.Results(
        args.out,
        bench="park_probe",
        command=" ".join(["python", "bench/park_probe.py", *(argv if argv is not None else sys.argv[1:])]),
        machine=g.machine_info(args.device),
        options=vars(args),
    )
    rows = []
    for mode in args.modes.split(","):
        with res.section(f"park/{mode}") as out:
            out.update(park_mode(mode, args, tok))
            rows.append(out)
            if not out["pass"]:  # a probe that measured a broken park fails its section, and so the bench
                raise AssertionError(
                    f"park/{mode}: exact lengths {out['all_exact_length']}, parked at the suspend "
                    f"{out['counts_at_suspend']['parked']}, requests spanning the handoff {out['spanning_requests']}"
                )
    if not args.skip_decode:
        with res.section("adapter_decode") as out:
            out.update(adapter_decode(args, tok))
    cols = [
        "mode",
        "graphs",
        "pass",
        "all_exact_length",
        "spanning_requests",
        "finished_before_suspend",
        "suspend_ms",
        "resume_ms",
        "train_step_ms",
        "bring_up_s",
    ]
    for r in rows:
        r["parked"] = r.get("counts_at_suspend", {}).get("parked")
    print(g.table(rows, [*cols[:3], "parked", *cols[3:]]))
    dec = res.data["sections"].get("adapter_decode")
    if dec:
        print("adapter decode:", {k: v for k, v in dec.items() if not isinstance(v, dict)})
        print(" graphs on:", dec.get("graphs_on"), "\n graphs off:", dec.get("graphs_off"))
    print(f"wrote {args.out}")
    return g.failed_sections(res.data)


if __name__ == "__main__":
    sys.exit(main())
