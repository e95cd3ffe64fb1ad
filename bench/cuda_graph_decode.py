"""CUDA-graph decode on the one model that trains: speed, greedy equality, and what a train step costs.

One model object (``cuda_graph_impl="local"``) carries two dynamic engines: one with pre-captured graphs
(``InferenceConfig.num_cuda_graphs``) and one with none (eager decode on the same layers). Measured:

* decode tokens/s of each at batch 1, 16, 64 (requests prefilled, then a window of pure decode steps);
* greedy tokens of both on the same weights, before and after training steps (same tokens? first divergence);
* train step times on that model (the first one profiled with cProfile), the CUDA-graph runners the train
  forward creates (the local impl routes every training forward of a TransformerLayer through its graph
  manager, which records it for a training-graph capture), against an eager model (``cuda_graph_impl="none"``)
  holding the same weights;
* the same for ``inference_cuda_graph_scope="block"`` (one graph per TransformerBlock, no manager on the layers).

    python bench/cuda_graph_decode.py --out bench/results/cuda_graph_decode.json     # GPU, ~2 min
    python bench/cuda_graph_decode.py --device cpu --quick                            # CPU: train-step part only
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository, for bench.* and colo_fsm
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _gpu as g  # noqa: E402


def compare_greedy(a: list[tuple[list[int], list[float]]], b: list[tuple[list[int], list[float]]]) -> dict[str, Any]:
    """Token equality of two greedy runs, first divergence and the largest log-prob gap before it."""
    same = 0
    first_div: list[int | None] = []
    max_lp = 0.0
    for (ta, la), (tb, lb) in zip(a, b):
        if ta == tb:
            same += 1
            first_div.append(None)
        else:
            first_div.append(next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb))))
        n = first_div[-1] if first_div[-1] is not None else min(len(la), len(lb))
        for x, y in zip(la[:n], lb[:n]):
            max_lp = max(max_lp, abs(x - y))
    divs = [d for d in first_div if d is not None]
    return {
        "sequences": len(a),
        "identical_sequences": same,
        "all_identical": same == len(a) and len(a) == len(b),
        "earliest_divergence": min(divs) if divs else None,
        "median_divergence": sorted(divs)[len(divs) // 2] if divs else None,
        "max_logprob_abs_diff_before_divergence": max_lp,
        "tokens_per_sequence": len(a[0][0]) if a else 0,
    }


def profile_top(prof: cProfile.Profile, n: int = 25) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(n)
    return s.getvalue()[-6000:]


def train_steps(
    trainer: Any, batches: list[list[Any]], device: str, *, profile_first: bool, model: Any = None
) -> dict[str, Any]:
    """Time each train step; the first one under cProfile if asked; graph-runner counts after each."""
    times = []
    counts: list[dict[str, Any]] = []
    prof_txt = None
    for i, batch in enumerate(batches):
        prof = cProfile.Profile() if (profile_first and i == 0) else None
        g.sync(device)
        t = time.perf_counter()
        if prof:
            prof.enable()
        try:
            trainer.train_step(batch)
            g.sync(device)
        finally:  # a failed step must not leave the profiler running under every later section
            if prof:
                prof.disable()
        if prof:
            prof_txt = profile_top(prof)
        times.append(time.perf_counter() - t)
        if model is not None and device == "cuda":
            try:
                counts.append(g.graph_runner_counts(model))
            except Exception as exc:  # counts are diagnostics
                counts.append({"error": str(exc)})
    return {
        "step_s": times,
        "first_s": times[0],
        "median_after_first_s": g.median(times[1:]),
        "shapes": [len(b[0].prompt_ids) + max(len(r.completion_ids) for r in b) for b in batches],
        "graph_counts_after_each": counts,
        "profile_first_step": prof_txt,
    }


def make_batches(
    n_fixed: int, n_var: int, quick: bool, *, trim: int = 0, seed: int = 0
) -> tuple[list[list[Any]], list[list[Any]]]:
    """Fixed-shape batches (8 x (32 + 480 - trim) tokens) and heavy-tailed ones; ``trim``/``seed`` give each
    model shapes no earlier model ran, so a first-time-shape cost is charged to every model alike."""
    comp = (96 if quick else 480) - trim
    fixed = [g.rollouts(8, [comp], seed=seed + i) for i in range(n_fixed)]
    var = []
    for i in range(n_var):
        lens = g.heavy_tail_lengths(8, 16 if quick else 64, comp, seed=seed + 100 + i)
        var.append(g.rollouts(8, lens, seed=seed + 100 + i))
    return fixed, var


def warm_process(shape: g.GPTShape, device: str) -> dict[str, Any]:
    """Two train steps of a 2-layer eager model at a shape nothing else uses: the process's one-time
    autograd / attention / optimizer initialisation stays out of the measured first steps."""
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    small = g.GPTShape(layers=2, hidden=shape.hidden, heads=shape.heads, vocab=shape.vocab, seq=shape.seq)
    m = g.build_gpt(small, device, graphs=False, reset_rng=False)
    tr = MegatronTrainer(m, TrainerConfig(lr=1e-4))
    batch = g.rollouts(4, [100])
    times = [g.timed(lambda: tr.train_step(batch), device)[1] for _ in range(2)]
    tr.offload_buffers()
    return {"step_s": times}


def sdpa_backends() -> dict[str, Any]:
    import torch

    b = torch.backends.cuda
    return {
        "cudnn": b.cudnn_sdp_enabled(),
        "flash": b.flash_sdp_enabled(),
        "mem_efficient": b.mem_efficient_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", default="bench/results/cuda_graph_decode.json")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per batch size")
    ap.add_argument("--num-cuda-graphs", type=int, default=16)
    ap.add_argument("--buffer-gb", type=float, default=4.0)
    ap.add_argument("--max-requests", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=64, help="greedy tokens per prompt in the equality check")
    ap.add_argument("--train-steps", type=int, default=4, help="fixed-shape train steps (then as many varied)")
    ap.add_argument("--scopes", default="layer,block")
    ap.add_argument("--quick", action="store_true", help="small model (CPU smoke run)")
    args = ap.parse_args(argv)

    import torch

    g.quiet_logs()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_graph_decode: no CUDA device here; run with --device cpu for the train-step part")
        return 0
    shape = g.SMALL if args.quick else g.GPTShape()
    g.setup(args.device)
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    tok = CharTokenizer()
    batches = [int(b) for b in args.batches.split(",")]
    res = g.Results(
        args.out,
        bench="cuda_graph_decode",
        command=" ".join(["python", "bench/cuda_graph_decode.py", *(argv if argv is not None else sys.argv[1:])]),
        machine=g.machine_info(args.device),
        shape=g.asdict(shape),
        options=vars(args),
    )
    gpu = args.device == "cuda"
    eq_prompts = g.prompts(16, 32, seed=7)
    trims = {"layer": 0, "block": 8, "none": 0, "plain": 16, "plain_no_cudnn": 24}
    st: dict[str, Any] = {}
    with res.section("warm_process") as out:
        if gpu:
            from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True, force_reset_rng=True)
        out.update(warm_process(shape, args.device))
        if gpu:
            out["sdpa_backends"] = sdpa_backends()

    def opts(graphs: bool) -> g.EngineOptions:
        return g.EngineOptions(
            buffer_gb=args.buffer_gb,
            max_requests=args.max_requests,
            max_sequence_length=shape.seq,
            num_cuda_graphs=args.num_cuda_graphs if graphs else None,
        )

    for scope in args.scopes.split(",") if gpu else ["none"]:
        pre = f"{scope}/"
        with res.section(pre + "build") as out:
            t = time.perf_counter()
            model = g.build_gpt(shape, args.device, graphs=gpu, scope=scope, reset_rng=False)
            out["build_s"] = time.perf_counter() - t
            out["params"] = g.n_params(model)
            if "model" in st:  # the same weights as the first model (trained by then)
                missing, unexpected = model.load_state_dict(st["model"].state_dict(), strict=False)
                out["load_state_dict"] = {"missing": list(missing), "unexpected": list(unexpected)}
            st[scope] = model
            st.setdefault("model", model)
        model = st.get(scope)
        if model is None:
            continue
        if gpu:
            with res.section(pre + "graphs_engine") as out:
                G = g.BenchEngine(model, tok, opts(True))
                st[pre + "G"] = G
                out["build"] = G.build
                out["graph_counts"] = g.graph_runner_counts(model)
                out["greedy_before"] = G.generate(eq_prompts, args.gen_tokens)
                out["decode"] = [G.decode_rate(b, steps=args.steps) for b in batches]
                G.suspend()
            with res.section(pre + "eager_engine_same_model") as out:
                E = g.BenchEngine(model, tok, opts(False))
                st[pre + "E"] = E
                out["build"] = E.build
                out["greedy_before"] = E.generate(eq_prompts, args.gen_tokens)
                out["decode"] = [E.decode_rate(b, steps=args.steps) for b in batches]
                E.suspend()
                gs = res.data["sections"].get(pre + "graphs_engine", {})
                if "greedy_before" in gs:
                    out["greedy_vs_graphs_before_training"] = compare_greedy(gs["greedy_before"], out["greedy_before"])
        with res.section(pre + "train") as out:
            fixed, var = make_batches(args.train_steps, args.train_steps, args.quick, trim=trims[scope], seed=10)
            tr = MegatronTrainer(model, TrainerConfig(lr=1e-4))
            if gpu:
                out["graph_counts_before"] = g.graph_runner_counts(model)
            out["fixed_shape"] = train_steps(tr, fixed, args.device, profile_first=True, model=model)
            out["varied_shape"] = train_steps(tr, var, args.device, profile_first=False, model=model)
            tr.offload_buffers()
        if gpu and pre + "G" in st:
            with res.section(pre + "after_training") as out:
                G, eager = st[pre + "G"], st.get(pre + "E")  # eager: None where no eager engine was built
                G.resume()
                out["graph_counts_after_resume"] = g.graph_runner_counts(model)
                out["greedy_graphs"] = G.generate(eq_prompts, args.gen_tokens)
                out["decode_graphs_b16"] = G.decode_rate(16, steps=args.steps)
                G.suspend()
                before = res.data["sections"].get(pre + "graphs_engine", {}).get("greedy_before")
                if before:
                    out["graphs_output_changed_by_training"] = [t for t, _ in before] != [
                        t for t, _ in out["greedy_graphs"]
                    ]
                if eager is not None:
                    eager.resume()
                    out["greedy_eager"] = eager.generate(eq_prompts, args.gen_tokens)
                    eager.suspend()
                    out["greedy_graphs_vs_eager"] = compare_greedy(out["greedy_graphs"], out["greedy_eager"])
        if gpu and scope == "layer":
            with res.section("plain_model_eager") as out:
                P = g.build_gpt(shape, args.device, graphs=False, reset_rng=False)
                missing, unexpected = P.load_state_dict(model.state_dict(), strict=False)
                out["load_state_dict"] = {"missing": list(missing), "unexpected": list(unexpected)}
                PE = g.BenchEngine(P, tok, opts(False))
                out["build"] = PE.build
                out["greedy"] = PE.generate(eq_prompts, args.gen_tokens)
                out["decode"] = [PE.decode_rate(b, steps=args.steps) for b in batches]
                PE.suspend()
                aft = res.data["sections"].get(pre + "after_training", {})
                if "greedy_eager" in aft:
                    out["greedy_vs_same_object_eager"] = compare_greedy(aft["greedy_eager"], out["greedy"])
                if "greedy_graphs" in aft:
                    out["greedy_vs_same_object_graphs"] = compare_greedy(aft["greedy_graphs"], out["greedy"])
                trp = MegatronTrainer(P, TrainerConfig(lr=1e-4))
                fixed, var = make_batches(args.train_steps, args.train_steps, False, trim=trims["plain"], seed=20)
                out["train_fixed_shape"] = train_steps(trp, fixed, args.device, profile_first=True)
                out["train_varied_shape"] = train_steps(trp, var, args.device, profile_first=False)
                # the same on new shapes with cuDNN's SDPA backend off: is a first-time shape cost cuDNN's?
                fixed, var = make_batches(
                    args.train_steps, args.train_steps, False, trim=trims["plain_no_cudnn"], seed=30
                )
                torch.backends.cuda.enable_cudnn_sdp(False)
                try:
                    out["train_fixed_shape_no_cudnn_sdp"] = train_steps(trp, fixed, args.device, profile_first=True)
                    out["train_varied_shape_no_cudnn_sdp"] = train_steps(trp, var, args.device, profile_first=False)
                finally:
                    torch.backends.cuda.enable_cudnn_sdp(True)
                PE.shutdown(graphs=False)
                del P, PE, trp
        for k in (pre + "G", pre + "E"):
            eng = st.pop(k, None)
            if eng is not None:
                try:
                    eng.shutdown(graphs=k.endswith("G"))
                except Exception as exc:
                    print(f"shutdown {k}: {exc}")

    summarize(res.data)
    res.flush()
    print(f"wrote {args.out}")
    return g.failed_sections(res.data)


def summarize(data: dict[str, Any]) -> None:
    """Print the tables and store the headline figures under ``summary``."""
    secs = data["sections"]
    rows = []
    summary: dict[str, Any] = {}
    for scope in ("layer", "block"):
        gd = {d["batch"]: d for d in secs.get(f"{scope}/graphs_engine", {}).get("decode", [])}
        ed = {d["batch"]: d for d in secs.get(f"{scope}/eager_engine_same_model", {}).get("decode", [])}
        pd = {d["batch"]: d for d in secs.get("plain_model_eager", {}).get("decode", [])} if scope == "layer" else {}
        for b in sorted(set(gd) | set(ed)):
            gt = gd.get(b, {}).get("decode_tokens_per_s")
            et = ed.get(b, {}).get("decode_tokens_per_s")
            rows.append(
                {
                    "scope": scope,
                    "batch": b,
                    "graphs tok/s": gt,
                    "eager same model tok/s": et,
                    "eager plain model tok/s": pd.get(b, {}).get("decode_tokens_per_s"),
                    "speedup": gt / et if gt and et else None,
                    "graph step ms": gd.get(b, {}).get("step_ms"),
                    "eager step ms": ed.get(b, {}).get("step_ms"),
                }
            )
            if gt and et:
                summary[f"{scope}_speedup_b{b}"] = gt / et
        eq0 = secs.get(f"{scope}/eager_engine_same_model", {}).get("greedy_vs_graphs_before_training", {})
        eq1 = secs.get(f"{scope}/after_training", {}).get("greedy_graphs_vs_eager", {})
        if eq0 or eq1:
            summary[f"{scope}_greedy_identical_before_training"] = eq0.get("all_identical")
            summary[f"{scope}_greedy_identical_after_training"] = eq1.get("all_identical")
            summary[f"{scope}_graphs_output_changed_by_training"] = secs.get(f"{scope}/after_training", {}).get(
                "graphs_output_changed_by_training"
            )
        b = secs.get(f"{scope}/graphs_engine", {}).get("build", {})
        if b:
            summary[f"{scope}_capture"] = {
                "graphs_planned": b.get("graphs_planned"),
                "engine_init_incl_capture_s": b.get("engine_init_incl_graph_capture_s"),
            }
        tr = secs.get(f"{scope}/train", {})
        if tr:
            summary[f"{scope}_train_step"] = {
                "first_s": tr.get("fixed_shape", {}).get("first_s"),
                "median_fixed_s": tr.get("fixed_shape", {}).get("median_after_first_s"),
                "varied_s": tr.get("varied_shape", {}).get("step_s"),
            }
    tr = secs.get("none/train")
    if tr:
        summary["cpu_train_step"] = {"first_s": tr["fixed_shape"]["first_s"], "steps": tr["fixed_shape"]["step_s"]}
    pl = secs.get("plain_model_eager", {})
    if pl:
        summary["plain_train_step"] = {
            "first_s": pl.get("train_fixed_shape", {}).get("first_s"),
            "median_fixed_s": pl.get("train_fixed_shape", {}).get("median_after_first_s"),
            "varied_s": pl.get("train_varied_shape", {}).get("step_s"),
        }
    data["summary"] = summary
    if rows:
        print(
            g.table(
                rows,
                [
                    "scope",
                    "batch",
                    "graphs tok/s",
                    "eager same model tok/s",
                    "eager plain model tok/s",
                    "speedup",
                    "graph step ms",
                    "eager step ms",
                ],
            )
        )
    import json

    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
