"""Park vs drain vs sync: what a handoff that keeps in-flight rollouts is worth, with heavy-tailed output lengths.

One run, three modes, the same model (rebuilt from the same seed for each mode), prompts, output lengths and
sampling seeds:

* ``park``: the colocation :class:`~colo_fsm.machine.lifecycle.Lifecycle` with an
  :class:`~colo_fsm.collector.AsyncCollector` (``inflight="park"``) over the continuous-batching
  :class:`~colo_fsm.adapters.megatron.engine.MegatronEngine` (``inflight="park"``): each handoff stops at a
  decode-step boundary, the rollouts in flight stay parked and finish after the step under the new weights;
* ``drain``: the same with ``inflight="drain"`` on both: each handoff waits for every rollout in flight, so
  every step waits for the slowest one;
* ``sync``: no collector: generate the whole batch (tail included), then train; the same lifecycle handoffs.

Output lengths are lognormal (``--median-tokens``, ``--sigma``), cut at ``--max-tokens``; each request stops
at its drawn length (the bench's tokenizer has an end-of-document id the model never samples), so the tail is
real in every mode. ``samples_per_s`` counts trained samples per wall-clock second after ``--warmup`` steps;
``draining_share`` is the fraction of that wall-clock the lifecycle spent in Draining (from its trace);
``handoff_p50_ms`` the median time in Draining per step; ``spanning_rollouts`` the requests whose tokens came
from more than one weight version (they started before a training step and finished after it);
``decode_tokens_per_s`` the tokens generated per wall-clock second.

Usage::

    python bench/inflight_handoff.py --quick                   # CPU, tiny GPT, < 3 min on 2 shared cores
    python bench/inflight_handoff.py                           # CPU, longer
    python bench/inflight_handoff.py --device cuda --model gpt200m   # one GPU, megatron-core's dynamic engine

Writes ``bench/results/inflight_handoff.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "inflight_handoff.json"
MODES = ("park", "drain", "sync")


@dataclass(frozen=True)
class Shape:
    """Model and workload of one run (the same for every mode)."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    alphabet_size: int
    prompt_len: int
    max_tokens: int
    median_tokens: float
    sigma: float
    num_prompts_per_step: int
    samples_per_group: int
    max_trajectory_age_steps: int
    steps: int
    warmup: int
    max_active_requests: int
    lr: float
    temperature: float


MODELS: dict[str, Shape] = {
    # CPU: a tiny GPT whose decode step costs about the same for 1 or 24 short requests (per-step overhead
    # dominates; the CPU path recomputes every sequence each step, so long batches stop being cheap)
    "small": Shape(16, 1, 4, 16, 4, 64, 3.0, 1.6, 8, 2, 3, 100, 5, 48, 1e-4, 0.0),
    # one GPU: ~200M parameters (16 layers x 1024 hidden), long tails
    "gpt200m": Shape(1024, 16, 16, 200, 16, 1024, 64.0, 1.3, 32, 4, 2, 20, 2, 512, 1e-5, 1.0),
}
QUICK: dict[str, dict[str, Any]] = {"small": {"steps": 50, "warmup": 5}, "gpt200m": {"steps": 12, "warmup": 2}}


def output_length(seed: int, prompt: int, sample: int, shape: Shape) -> int:
    """The drawn output length of one request (lognormal, cut to ``[1, max_tokens]``); the same in every mode."""
    rng = random.Random(seed * 1_000_003 + prompt * 1009 + sample)
    x = rng.lognormvariate(math.log(shape.median_tokens), shape.sigma)
    return max(1, min(shape.max_tokens, round(x)))


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (NaN for an empty list)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))]


class NeverEndsTokenizer:
    """A :class:`CharTokenizer` whose end-of-document id lies outside the vocabulary: no request ends early, each
    stops at its drawn length."""

    def __init__(self, base: Any) -> None:
        self._base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    @property
    def eod(self) -> int:
        return int(self._base.vocab_size)


class Meter:
    """Completed requests: when, how many tokens, how many weight versions their tokens span."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[float, int, int]] = []

    def watch(self, handle: Any) -> Any:
        def done(f: Any) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            c = f.result()
            span = (max(c.weight_versions) - min(c.weight_versions)) if c.weight_versions else 0
            with self.lock:
                self.rows.append((time.monotonic(), len(c.token_ids), span))

        handle.future.add_done_callback(done)
        return handle

    def window(self, t0: float, t1: float) -> list[tuple[float, int, int]]:
        with self.lock:
            return [r for r in self.rows if t0 <= r[0] <= t1]


def run_mode(mode: str, args: argparse.Namespace, shape: Shape) -> dict[str, Any]:
    """One mode from a fresh model: returns its measured row."""
    from colo_fsm.adapters.batching import Priority
    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine, to_completion
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig
    from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, RolloutDeferred, StateTimer, TrajectoryGroup
    from colo_fsm.guards import CheckpointDecision, InFlightCap, ValidationDecision
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
    from colo_fsm.states.spec import State

    alphabet = "".join(chr(ord("a") + i) if i < 26 else chr(0x100 + i) for i in range(shape.alphabet_size))
    base_tok = CharTokenizer(alphabet)
    tok = NeverEndsTokenizer(base_tok)
    seq_len = shape.prompt_len + shape.max_tokens
    model = build_model(
        ModelConfig(
            vocab_size=base_tok.vocab_size,
            hidden_size=shape.hidden_size,
            num_layers=shape.num_layers,
            num_attention_heads=shape.num_attention_heads,
            max_sequence_length=seq_len,
            device=args.device,
            seed=args.seed,
            cuda_graphs=args.cuda_graphs is not None,
        )
    )
    trainer = MegatronTrainer(model, TrainerConfig(lr=shape.lr), pad_id=base_tok.pad)
    holder: dict[str, Lifecycle] = {}

    def version() -> int:
        lc = holder.get("lc")
        return lc.weight_version if lc is not None else 0

    engine = MegatronEngine(
        model,
        tok,
        GenerationConfig(
            inflight="drain" if mode == "drain" else "park",
            max_active_requests=shape.max_active_requests,
            backend="auto",
            num_cuda_graphs=args.cuda_graphs,
            buffer_size_gb=args.buffer_gb,
        ),
        weight_version=version,
        max_sequence_length=seq_len,
    )
    meter = Meter()
    target = base_tok.tokenize(alphabet[0])[0]

    def prompt_stream() -> Iterator[Prompt]:
        rng = random.Random(args.seed)
        i = 0
        while True:
            text = "".join(rng.choice(alphabet) for _ in range(shape.prompt_len))
            yield Prompt(f"p{i}", text, {"index": i})
            i += 1

    def submit(prompt: Prompt, j: int) -> Any:
        i = int(prompt.metadata["index"])
        return meter.watch(
            engine.submit(
                base_tok.tokenize(prompt.text),
                max_tokens=output_length(args.seed, i, j, shape),
                temperature=shape.temperature,
                seed=args.seed * 7919 + i * 131 + j,
                priority=Priority.TRAINING,
            )
        )

    def group_of(prompt: Prompt, outs: list[Any]) -> TrajectoryGroup:
        if any(o.finish_reason == "abort" for o in outs):
            raise RolloutDeferred("the engine was shut down")  # the run is over; not a failure
        rewards = [sum(1 for t in o.token_ids if t == target) / max(1, len(o.token_ids)) for o in outs]
        samples = [to_completion(o) for o in outs]
        return TrajectoryGroup(
            prompt.prompt_id,
            prompt.text,
            tuple(samples),
            tuple(rewards),
            weight_version=min(s.weight_version for s in samples),
            metadata={"prompt_ids": base_tok.tokenize(prompt.text)},
        )

    async def rollout(prompt: Prompt) -> TrajectoryGroup:
        handles = [submit(prompt, j) for j in range(shape.samples_per_group)]
        return group_of(prompt, [await h.wait() for h in handles])

    def to_rollouts(groups: list[TrajectoryGroup]) -> list[Any]:
        out = []
        for g in groups:
            ids = tuple(g.metadata["prompt_ids"])
            for s, r in zip(g.samples, g.rewards):
                out.append(Rollout(ids, tuple(s.token_ids), r, g.prompt_id, tuple(s.logprobs), g.weight_version))
        return out

    buffer = collector = None
    if mode != "sync":
        buffer = ReplayBuffer(shape.num_prompts_per_step, shape.max_trajectory_age_steps)
        collector = AsyncCollector(
            rollout,
            prompt_stream(),
            buffer,
            weight_version=version,
            cap=InFlightCap(
                shape.num_prompts_per_step, shape.max_trajectory_age_steps, samples_per_group=shape.samples_per_group
            ),
            admit=lambda: holder["lc"].state is State.GENERATING,
            inflight=mode,
            name=f"bench-{mode}",
        )
    lc = holder["lc"] = Lifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=shape.steps),
        checkpoint=CheckpointDecision(None),
        validation=ValidationDecision(None),
    )
    timer = StateTimer(lc.spec)
    lc.trace.subscribe(timer)
    occupancy: list[tuple[float, int, int]] = []  # (time, running, queued): how full the engine's batch is
    stop_sampling = threading.Event()

    def sample_occupancy() -> None:
        while not stop_sampling.wait(0.005):
            try:
                c = engine.request_counts()
            except Exception:
                continue
            occupancy.append((time.monotonic(), c.running, c.queued))

    sampler = threading.Thread(target=sample_occupancy, name="occupancy", daemon=True)
    stream = prompt_stream()
    step_ends: list[float] = []
    decode_steps: list[int] = []
    consumed: list[int] = []
    spans: list[int] = []
    t_start = time.monotonic()
    try:
        lc.start()
        sampler.start()
        while not lc.finished:
            if buffer is not None:
                groups = buffer.sample(lc.weight_version, timeout=args.sample_timeout)
            else:  # sync: the whole batch, tail included, then train
                prompts = [next(stream) for _ in range(shape.num_prompts_per_step)]
                handles = [[submit(p, j) for j in range(shape.samples_per_group)] for p in prompts]
                groups = [group_of(p, [h.result() for h in hs]) for p, hs in zip(prompts, handles)]
            batch = to_rollouts(groups)
            result = lc.step(batch)
            step_ends.append(time.monotonic())
            decode_steps.append(engine.steps)
            consumed.append(result.consumed_samples)
            spans += [g.version_span for g in groups]
            counts = engine.request_counts()
            if args.verbose:
                print(
                    f"  {mode} step {lc.step_index}: {result.consumed_samples} samples, "
                    f"queued/running/parked={counts.queued}/{counts.running}/{counts.parked}",
                    flush=True,
                )
    finally:
        stop_sampling.set()
        try:
            lc.stop()
        finally:
            if collector is not None:
                collector.close()
            if args.cuda_graphs is not None:
                # megatron-core keeps a process-wide record of the captured graphs, and with it the engine's
                # inference context (its KV buffer): free it before the next mode builds its own
                from megatron.core.transformer.cuda_graphs import delete_cuda_graphs

                delete_cuda_graphs()
    times = timer.pop_completed()
    w = shape.warmup
    t0, t1 = step_ends[w - 1] if w else t_start, step_ends[-1]
    measured = times[w:]
    rows = meter.window(t0, t1)
    occ = [(r, q) for t, r, q in occupancy if t0 <= t <= t1]
    run = {
        "occupancy_samples": len(occ),
        "active_sum": sum(r for r, _ in occ),
        "idle_samples": sum(1 for r, _ in occ if r == 0),
        "measured_s": t1 - t0,
        "trained_samples": sum(consumed[w:]),
        "state_s": {k: sum(d.get(k, 0.0) for d in measured) for k in sorted({k for d in measured for k in d})},
        "draining_s": [d.get(State.DRAINING.value, 0.0) for d in measured],
        "spanning_rollouts": sum(1 for r in rows if r[2] > 0),
        "max_version_span": max((r[2] for r in meter.window(t_start, t1)), default=0),
        "decode_tokens": sum(r[1] for r in rows),
        "decode_steps": decode_steps[-1] - (decode_steps[w - 1] if w else 0),
        "spanning_groups_trained": sum(1 for s in spans[w * shape.num_prompts_per_step :] if s > 0),
        "measured_steps": len(consumed) - w,
        "engine_backend": engine.backend_name,
        "run_s": time.monotonic() - t_start,
    }
    if collector is not None:
        run["collector"] = {
            k: v for k, v in asdict(collector.stats()).items() if k in ("started", "completed", "spanning", "failed")
        }
    return run


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's row over its rounds: totals over the measured windows (samples and tokens per wall-clock
    second, Draining's share of wall-clock from the lifecycle trace), the median handoff over every step."""
    measured_s = sum(r["measured_s"] for r in runs)
    state_s: dict[str, float] = {}
    for r in runs:
        for k, v in r["state_s"].items():
            state_s[k] = state_s.get(k, 0.0) + v
    total = sum(state_s.values())
    draining = [x for r in runs for x in r["draining_s"]]
    return {
        "samples_per_s": sum(r["trained_samples"] for r in runs) / measured_s,
        "draining_share": state_s.get("Draining", 0.0) / total if total else float("nan"),
        "handoff_p50_ms": pct(draining, 50) * 1e3,
        "handoff_max_ms": max(draining) * 1e3 if draining else float("nan"),
        "spanning_rollouts": sum(r["spanning_rollouts"] for r in runs),
        "max_version_span": max(r["max_version_span"] for r in runs),
        "decode_tokens_per_s": sum(r["decode_tokens"] for r in runs) / measured_s,
        "decode_steps_per_s": sum(r["decode_steps"] for r in runs) / measured_s,
        "tokens_per_decode_step": sum(r["decode_tokens"] for r in runs) / max(1, sum(r["decode_steps"] for r in runs)),
        "mean_running_requests": sum(r["active_sum"] for r in runs) / max(1, sum(r["occupancy_samples"] for r in runs)),
        "engine_idle_share": sum(r["idle_samples"] for r in runs) / max(1, sum(r["occupancy_samples"] for r in runs)),
        "spanning_groups_trained": sum(r["spanning_groups_trained"] for r in runs),
        "measured_steps": sum(r["measured_steps"] for r in runs),
        "measured_s": measured_s,
        "trained_samples": sum(r["trained_samples"] for r in runs),
        "state_share": {k: v / total for k, v in state_s.items()} if total else {},
        "per_round_samples_per_s": [r["trained_samples"] / r["measured_s"] for r in runs],
        "engine_backend": runs[0]["engine_backend"],
        "rounds": len(runs),
    }


def main(argv: list[str] | None = None) -> int:
    """Run park, drain and sync; print the table; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", choices=sorted(MODELS), default=None, help="small (CPU default) or gpt200m")
    ap.add_argument("--quick", action="store_true", help="fewer steps (under 3 min on 2 CPU cores)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of park,drain,sync")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None, help="steps not measured (default per model)")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--median-tokens", type=float, default=None)
    ap.add_argument("--sigma", type=float, default=None)
    ap.add_argument("--num-prompts-per-step", type=int, default=None)
    ap.add_argument("--samples-per-group", type=int, default=None)
    ap.add_argument("--max-age", type=int, default=None, help="max_trajectory_age_steps")
    ap.add_argument("--max-active", type=int, default=None, help="the engine's max_active_requests")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (small: 0, gpt200m: 1)")
    ap.add_argument(
        "--rounds", type=int, default=None, help="rounds of park, drain, sync, interleaved (default 3; --quick 4)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    ap.add_argument("--sample-timeout", type=float, default=600.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--cuda-graphs",
        type=int,
        default=None,
        metavar="N",
        help="CUDA-graph decode (GPU): ModelConfig(cuda_graphs=True), GenerationConfig(num_cuda_graphs=N)",
    )
    ap.add_argument("--buffer-gb", type=float, default=1.0, help="KV buffer of the dynamic engine (GiB)")
    args = ap.parse_args(argv)
    model_name = args.model or ("gpt200m" if args.device == "cuda" else "small")
    shape = MODELS[model_name]
    if args.quick:
        shape = replace(shape, **QUICK[model_name])
    overrides = {
        "steps": args.steps,
        "warmup": args.warmup,
        "max_tokens": args.max_tokens,
        "median_tokens": args.median_tokens,
        "sigma": args.sigma,
        "num_prompts_per_step": args.num_prompts_per_step,
        "samples_per_group": args.samples_per_group,
        "max_trajectory_age_steps": args.max_age,
        "max_active_requests": args.max_active,
        "temperature": args.temperature,
    }
    shape = replace(shape, **{k: v for k, v in overrides.items() if v is not None})
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes: {bad or modes} not in {MODES}")
    if shape.warmup >= shape.steps:
        ap.error(f"--warmup {shape.warmup} must be below --steps {shape.steps}")

    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("inflight_handoff: --device cuda but no CUDA device here; nothing to measure")
            return 0
        os.environ.setdefault("LOCAL_RANK", "0")
    if args.device == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("colo_fsm").setLevel(logging.ERROR)
    from colo_fsm.adapters.megatron.parallel import init_distributed, shutdown_distributed

    init_distributed(1, device=args.device)
    lengths = [output_length(args.seed, i, j, shape) for i in range(400) for j in range(shape.samples_per_group)]
    print(
        f"inflight_handoff: model={model_name} device={args.device} steps={shape.steps} (warmup {shape.warmup}) "
        f"batch={shape.num_prompts_per_step}x{shape.samples_per_group} max_age={shape.max_trajectory_age_steps}; "
        f"output lengths lognormal(median {shape.median_tokens:g}, sigma {shape.sigma:g}) cut at {shape.max_tokens}: "
        f"p50 {pct(lengths, 50):.0f}, p90 {pct(lengths, 90):.0f}, p99 {pct(lengths, 99):.0f}, "
        f"mean {statistics.fmean(lengths):.1f}",
        flush=True,
    )
    rounds = args.rounds or (4 if args.quick else 3)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    t_all = time.monotonic()
    try:
        for k in range(rounds):  # interleaved, so a busy moment of a shared machine hits every mode alike
            for mode in modes:
                r = run_mode(mode, args, shape)
                runs[mode].append(r)
                print(
                    f"  round {k + 1}/{rounds} {mode}: {r['trained_samples'] / r['measured_s']:.1f} samples/s, "
                    f"draining {sum(r['draining_s']):.2f} of {r['measured_s']:.2f} s, run {r['run_s']:.1f} s",
                    flush=True,
                )
                # what is measured so far, in case the run is cut short (a time-limited GPU call)
                partial = Path(str(args.out) + ".partial")
                partial.parent.mkdir(parents=True, exist_ok=True)
                done = {m: summarize(rs) for m, rs in runs.items() if rs}
                partial.write_text(json.dumps({"rounds_done": k + 1, "modes": done}, indent=1), encoding="utf-8")
    finally:
        shutdown_distributed()
    results = {m: summarize(rs) for m, rs in runs.items()}
    cols = [
        ("mode", "{}"),
        ("samples_per_s", "{:.2f}"),
        ("draining_share", "{:.3f}"),
        ("handoff_p50_ms", "{:.1f}"),
        ("spanning_rollouts", "{}"),
        ("max_version_span", "{}"),
        ("decode_tokens_per_s", "{:.0f}"),
    ]
    print()
    print("  ".join(f"{c:>19}" if i else f"{c:<6}" for i, (c, _) in enumerate(cols)))
    for m, r in results.items():
        cells = [m] + [fmt.format(r[c]) for c, fmt in cols[1:]]
        print("  ".join(f"{x:>19}" if i else f"{x:<6}" for i, x in enumerate(cells)))
    out: dict[str, Any] = {
        "benchmark": "inflight_handoff",
        "command": " ".join([Path(sys.executable).name, "bench/inflight_handoff.py", *(argv or sys.argv[1:])]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "torch_threads": torch.get_num_threads(),
        },
        "model": model_name,
        "rounds": rounds,
        "shape": asdict(shape),
        "output_lengths": {
            "p50": pct(lengths, 50),
            "p90": pct(lengths, 90),
            "p99": pct(lengths, 99),
            "max": max(lengths),
            "mean": statistics.fmean(lengths),
        },
        "modes": results,
        "total_s": time.monotonic() - t_all,
    }
    if "park" in results and "drain" in results:
        out["ratio_park_over_drain"] = results["park"]["samples_per_s"] / results["drain"]["samples_per_s"]
    if "park" in results and "sync" in results:
        out["ratio_park_over_sync"] = results["park"]["samples_per_s"] / results["sync"]["samples_per_s"]
    print()
    for k in ("ratio_park_over_drain", "ratio_park_over_sync"):
        if k in out:
            print(f"{k} = {out[k]:.2f}")
    print(f"total {out['total_s']:.0f} s")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1), encoding="utf-8")
    tmp.replace(path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
