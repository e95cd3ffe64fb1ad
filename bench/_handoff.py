"""Pieces of ``bench/inflight_handoff.py`` (not a benchmark itself: ``run_all`` skips files starting with ``_``):
the reasoning workload, the engine factory (one function per way of building the engine, so another can plug
in), the JSON report written after every mode, the side-by-side table and its ratios."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._stats import minmax, pct

# The reasoning-RL shape: long, heavy-tailed rollouts, hundreds in flight (see the bench's docstring).
REASONING: dict[str, Any] = {
    "prompt_len": 64,
    "max_tokens": 8192,
    "median_tokens": 768.0,
    "sigma": 1.0,
    "num_prompts_per_step": 32,
    "samples_per_group": 8,
    "max_active_requests": 256,
    "max_trajectory_age_steps": 2,
    "steps": 3,
    "warmup": 1,
    "temperature": 1.0,
}
# The same code path on the CPU in seconds (the test that keeps the bench from rotting runs this).
SMOKE: dict[str, Any] = {
    "prompt_len": 4,
    "max_tokens": 48,
    "median_tokens": 8.0,
    "sigma": 1.0,
    "num_prompts_per_step": 4,
    "samples_per_group": 2,
    "max_active_requests": 16,
    "max_trajectory_age_steps": 2,
    "steps": 3,
    "warmup": 1,
    "temperature": 0.0,
    "micro_batch_tokens": 64,
}


def mode_unavailable(mode: str) -> str | None:
    """Why ``mode`` cannot run with this checkout (None when it can): ``abort`` needs the engine and the
    collector to accept ``inflight="abort"``."""
    if mode != "abort":
        return None
    from colo_fsm.adapters.megatron.engine import GenerationConfig
    from colo_fsm.collector.collector import parse_inflight
    from colo_fsm.errors import ConfigError

    try:
        GenerationConfig(inflight="abort")
        parse_inflight("abort")
    except ConfigError as exc:
        return f"inflight='abort' is not offered by this checkout's engine/collector ({exc})"
    return None


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


def spread(xs: list[float]) -> dict[str, float] | None:
    """Median, min and max of ``xs`` (None for no values)."""
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def spread_text(row: dict[str, Any]) -> str:
    """How one mode's figure varies: over its runs when it has two or more, else over its measured steps."""
    runs = row.get("per_round_samples_per_s") or []
    if len(runs) >= 2:
        return f"runs {min(runs):.2f}-{max(runs):.2f}"
    steps = row.get("step_samples_per_s") or {}
    return f"steps {steps['min']:.2f}-{steps['max']:.2f}" if steps else "-"


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's row over its rounds: samples made in the measured windows and trained, per wall-clock second
    (``samples_per_s``), with their spread over rounds and over single steps; tokens per second; Draining's share
    of wall-clock from the lifecycle trace; the median handoff over every step."""
    measured_s = sum(r["measured_s"] for r in runs)
    state_s: dict[str, float] = {}
    for r in runs:
        for k, v in r["state_s"].items():
            state_s[k] = state_s.get(k, 0.0) + v
    total = sum(state_s.values())
    draining = [x for r in runs for x in r["draining_s"]]
    stats: dict[str, int] = {}
    for r in runs:
        for k, v in (r.get("inflight_stats") or {}).items():
            stats[k] = stats.get(k, 0) + int(v)
    row = {
        "samples_per_s": sum(r["fresh_samples"] for r in runs) / measured_s,
        "trained_samples_per_s": sum(r["trained_samples"] for r in runs) / measured_s,  # incl. made before the window
        "step_samples_per_s": spread([x for r in runs for x in r["step_samples_per_s"]]),
        "per_round_samples_per_s": [r["fresh_samples"] / r["measured_s"] for r in runs],
        "draining_share": state_s.get("Draining", 0.0) / total if total else float("nan"),
        "handoff_p50_ms": pct(draining, 50) * 1e3,
        "handoff_max_ms": max(draining) * 1e3 if draining else float("nan"),
        "spanning_rollouts": sum(r["spanning_rollouts"] for r in runs),
        "max_version_span": max(r["max_version_span"] for r in runs),
        "decode_tokens_per_s": sum(r["decode_tokens"] for r in runs) / measured_s,
        "decode_steps_per_s": sum(r["decode_steps"] for r in runs) / measured_s,
        # tokens per second while the engine may decode (Generating + Draining): what graph decode is compared to
        "engine_decode_tokens_per_s": sum(r["decode_tokens"] for r in runs)
        / max(1e-9, state_s.get("Generating", 0.0) + state_s.get("Draining", 0.0)),
        "tokens_per_decode_step": sum(r["decode_tokens"] for r in runs) / max(1, sum(r["decode_steps"] for r in runs)),
        "mean_running_requests": sum(r["active_sum"] for r in runs) / max(1, sum(r["occupancy_samples"] for r in runs)),
        "engine_idle_share": sum(r["idle_samples"] for r in runs) / max(1, sum(r["occupancy_samples"] for r in runs)),
        "spanning_groups_trained": sum(r["spanning_groups_trained"] for r in runs),
        # the prompts the measured steps trained, first and last stream index (each round trains the same ones)
        "trained_prompts": minmax([x for r in runs for x in (r.get("trained_prompts") or [])]),
        "measured_steps": sum(r["measured_steps"] for r in runs),
        "measured_steps_per_round": [r["measured_steps"] for r in runs],
        "measured_s": measured_s,
        "trained_samples": sum(r["trained_samples"] for r in runs),
        "fresh_samples": sum(r["fresh_samples"] for r in runs),
        "state_share": {k: v / total for k, v in state_s.items()} if total else {},
        # load-independent on the CPU (one torch thread): trained samples per second of this process's CPU time
        "samples_per_cpu_s": sum(r["fresh_samples"] for r in runs) / max(1e-9, sum(r["cpu_s"] for r in runs)),
        "cpu_share": sum(r["cpu_s"] for r in runs) / measured_s,  # CPU time / wall-clock: low when contended
        "loadavg": [round(x, 2) for r in runs for x in (r["loadavg_start"], r["loadavg_end"])],
        "cut_by_budget": any(r["cut_by_budget"] for r in runs),
        "warmup_steps": runs[0]["warmup_steps"],
        "peak_allocated_gib": max((r["peak_allocated_gib"] or 0.0) for r in runs) or None,
        "engine_backend": runs[0]["engine_backend"],
        "rounds": len(runs),
        **({"inflight_stats": stats} if stats else {}),
        # the prompt groups in flight when each measured handoff began; in drain, 0 is the trainer-first outcome of
        # its race with the collector (inflight_handoff.py's docstring), which a drain figure depends on
        **(
            {
                "groups_in_flight_at_handoff": (held := [x for r in runs for x in r["groups_in_flight_at_handoff"]]),
                "handoffs_with_nothing_in_flight": sum(1 for x in held if x == 0),
            }
            if all("groups_in_flight_at_handoff" in r for r in runs)
            else {}
        ),
        # --drain-race collector-first: the seconds each measured handoff waited for the collector's admission
        **(
            {"collector_first_waits_s": [x for r in runs for x in r["collector_first_waits_s"]]}
            if all("collector_first_waits_s" in r for r in runs)
            else {}
        ),
        # megatron's coordinator loop: its steps from asking each measured handoff's pause to SUSPENDED (a pause
        # lands at the loop's next consensus: CoordinatorConfig.ep_consensus_interval)
        **(
            {"pause_steps": (paused := [x for r in runs for x in r["pause_steps"]]), "pause_steps_max": max(paused)}
            if all("pause_steps" in r for r in runs) and any(r["pause_steps"] for r in runs)
            else {}
        ),
        # megatron's dynamic engine: its kinds of decode step over each round's measured window (step_profile.py)
        **(
            {"engine_step_profile_per_round": [r["engine_step_profile"] for r in runs]}
            if all("engine_step_profile" in r for r in runs)
            else {}
        ),
    }
    row["buffer_growth"] = buffer_growth(row)  # made - trained, over trained: ~0 in steady state
    return row


def release_model_graphs(model: Any) -> None:
    """Free what megatron-core still holds of ``model``'s CUDA graphs once its mode is over: the process-wide graph
    records (``delete_cuda_graphs``), the graph runners of its managers (each keeps the inference context, the KV
    buffer, of its capture) and ``toggle_cuda_graphs``'s module cache entry, keyed by ``id(model)`` (it would
    keep the model alive, and a later model at the same address would be toggled through the dead one's modules)."""
    from megatron.core.transformer import utils as mutils
    from megatron.core.transformer.cuda_graphs import delete_cuda_graphs

    delete_cuda_graphs()
    managers = [m.cudagraph_manager for m in model.modules() if getattr(m, "cudagraph_manager", None) is not None]
    cache = getattr(mutils, "cuda_graph_attr_cache", None)
    entry = cache.pop(id(model), None) if isinstance(cache, dict) else None
    if entry:
        managers += [pair[1] for pair in entry.get("cudagraph_manager", []) if pair[1] is not None]
    for mgr in managers:
        if hasattr(mgr, "cudagraph_runners"):
            mgr.cudagraph_runners = []
        table = getattr(mgr, "custom_cudagraphs_lookup_table", None)
        if table is not None:
            table.clear()


EngineFactory = Callable[..., Any]


def direct_engine(
    mode: str,
    args: Any,
    shape: Any,
    model: Any,
    tokenizer: Any,
    weight_version: Callable[[], int],
    max_sequence_length: int,
) -> Any:
    """colo-fsm's :class:`~colo_fsm.adapters.megatron.engine.MegatronEngine` (megatron-core's dynamic engine
    driven directly, ``use_coordinator=False``), with the mode's in-flight policy (sync runs as park: it never
    suspends with requests in flight)."""
    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine

    return MegatronEngine(
        model,
        tokenizer,
        GenerationConfig(
            inflight="park" if mode == "sync" else mode,
            max_active_requests=shape.max_active_requests,
            backend="auto",
            num_cuda_graphs=args.cuda_graphs,
            cuda_graph_sizing=args.graph_sizing,
            buffer_size_gb=args.buffer_gb,
        ),
        weight_version=weight_version,
        max_sequence_length=max_sequence_length,
    )


def coordinator_engine(*args: Any, **kwargs: Any) -> Any:
    """megatron-core's coordinator mode (``bench/_coordinator.py``; GPU, pyzmq and msgpack)."""
    from bench._coordinator import coordinator_engine as build

    return build(*args, **kwargs)


ENGINES: dict[str, EngineFactory] = {"direct": direct_engine, "coordinator": coordinator_engine}
"""``--engine`` choices: name -> factory ``(mode, args, shape, model, tokenizer, weight_version, max_len)``."""


MIN_STEPS = 3
# A window whose samples made differ from its samples trained by more than this share of them was filling (or
# emptying) its buffer: not the mode's steady state, so no ratio (e.g. drain started with an empty buffer).
MAX_BUFFER_GROWTH = 0.2
"""A ratio is computed only between modes that each ran this many measured steps or more: a one-step figure is an
anecdote (on one H200 the first reasoning-workload figures, park/drain 2.26 and park/sync 2.51, were one step
each; with 3 measured steps per mode in steady state, at commit 6bd92a8, they came out 1.73 and 1.73:
docs/gpu-runs/README.md)."""


DRAIN_RACES = ("free", "collector-first")
"""How the bench's ``drain`` meets the race after each resume (the collector admitting, the trainer handing off):
``free`` lets the threads run as they do (either may go first); ``collector-first`` holds each handoff until the
collector has started every rollout its admission allows (:func:`wait_for_admission`), so every handoff drains
the groups admitted after the step before. ``drain-hold`` forces the other outcome."""

ADMISSION_WAIT_S = 10.0
"""How long a ``collector-first`` handoff waits for the collector's admission before it goes on anyway (its wait is
then recorded as None: that handoff was not forced)."""


def window_taken(buffer: Any) -> bool:
    """Whether the collector may start no rollout for the step in hand: the buffer's finished and reserved groups,
    with the batch just sampled, fill its window (``ReplayBuffer.reserve`` refuses the next place). Only right after
    ``sample`` at the current weight version, as the bench calls it: before it, the step's batch is still queued and
    would be counted twice. One snapshot of the buffer (``stats``), so a group finishing meanwhile is counted once."""
    st = buffer.stats()
    return st.size + st.pending + buffer.num_prompts_per_step >= buffer.window


def wait_for_admission(
    buffer: Any, collector: Any, timeout_s: float = ADMISSION_WAIT_S, poll_s: float = 0.001
) -> float | None:
    """Wait until the collector has started every rollout it may (the buffer's window taken, or its in-flight cap
    reached); return the seconds waited, or None if ``timeout_s`` passed first (the collector failed, ran out of
    prompts, or its admission was closed)."""
    t0 = time.monotonic()
    while not (window_taken(buffer) or collector.in_flight >= collector.cap):
        if collector.error is not None or time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(poll_s)
    return time.monotonic() - t0


def ratio_refusal(name: str, row: dict[str, Any] | None) -> str | None:
    """Why mode ``name`` cannot enter a ratio (None when it can)."""
    if row is None:
        return f"{name} was not measured"
    if "samples_per_s" not in row:
        return f"{name} did not run ({row.get('skipped', 'no measured step')})"
    if row["measured_steps"] < MIN_STEPS:
        return f"{name} has {row['measured_steps']} measured step(s), fewer than {MIN_STEPS}"
    if not row["samples_per_s"] > 0:
        return f"{name} made no sample in its measured window"
    waits = row.get("collector_first_waits_s") or []
    if None in waits:
        return (
            f"{name}'s race was to be forced collector-first, and {waits.count(None)} of its {len(waits)} measured "
            f"handoffs went on without the collector's admission (it did not finish within {ADMISSION_WAIT_S:.0f} s)"
        )
    growth = unsteady_growth(row)
    if growth is not None:
        return (
            f"{name} made {row['fresh_samples']} samples and trained {row['trained_samples']} in its window "
            f"({growth:+.0%}, more than {MAX_BUFFER_GROWTH:.0%}): its buffer was {buffer_trend(growth)}, not in "
            "steady state"
        )
    return None


def buffer_trend(growth: float) -> str:
    """What a window's :func:`buffer_growth` did to its buffer, in a word: filling (made more than it trained) or
    emptying (trained samples made before the window)."""
    return "filling" if growth > 0 else "emptying"


def unsteady_growth(row: dict[str, Any]) -> float | None:
    """The window's :func:`buffer_growth` where it passes :data:`MAX_BUFFER_GROWTH` either way (no steady state);
    None where it does not, or where the row cannot say. The one place the bench and the report apply the limit."""
    growth = buffer_growth(row)
    return growth if growth is not None and abs(growth) > MAX_BUFFER_GROWTH else None


def buffer_growth(row: dict[str, Any]) -> float | None:
    """(samples made - samples trained) / trained over a mode's measured window: near 0 in steady state, where the
    buffer holds as much at the window's end as at its start (None when the row does not say)."""
    made, trained = row.get("fresh_samples"), row.get("trained_samples")
    if made is None or not trained:
        return None
    return (made - trained) / trained


def ratio_name(other: str) -> str:
    """The ratio of park over mode ``other`` as JSON keys spell it: ``park_over_drain_hold`` for ``drain-hold``."""
    return f"park_over_{other.replace('-', '_')}"


def mode_of_ratio(name: str) -> str:
    """The mode a ``park_over_...`` ratio name (or ``ratio_park_over_...`` key) divides by: :func:`ratio_name`'s
    inverse."""
    return name.split("park_over_", 1)[1].replace("_", "-")


def add_ratios(out: dict[str, Any]) -> None:
    """Park against each other mode in samples/s (and samples per CPU-second), and park's decode tokens/s against
    the pure graph decode at the batch nearest park's mean concurrency (which then becomes
    ``graph_decode_tokens_per_s``), only between modes that each have :data:`MIN_STEPS` measured steps or more;
    for every other pair ``out["no_ratio"]`` says why there is none. With two or more interleaved rounds each
    ratio also gets its per-round values."""
    modes = out.get("modes", {})
    park = modes.get("park")
    no_ratio: dict[str, str] = {}
    for k in [k for k in out if k.startswith("ratio_park_")]:
        del out[k]  # recomputed from the rows as they are now
    for other in ("sync", "drain", "abort", "drain-hold"):
        if other not in modes:
            continue
        name = ratio_name(other)
        why = ratio_refusal("park", park) or ratio_refusal(other, modes[other])
        if why:
            no_ratio[name] = why
            continue
        assert park is not None
        out[f"ratio_{name}"] = park["samples_per_s"] / modes[other]["samples_per_s"]
        out[f"ratio_{name}_cpu"] = park["samples_per_cpu_s"] / modes[other]["samples_per_cpu_s"]
        mine, theirs = park["per_round_samples_per_s"], modes[other]["per_round_samples_per_s"]
        if len(mine) >= 2 and len(mine) == len(theirs):
            # a round whose window made nothing (e.g. a drain-hold round cut after a step that drained nothing) has
            # no ratio: None, not a division by zero in the middle of a run
            out[f"ratio_{name}_per_round"] = [a / b if b > 0 else None for a, b in zip(mine, theirs)]
    graph = out.get("graph_decode", {})
    for suffix, rows in (("", graph.get("rows")), ("_matched_context", graph.get("rows_matched_context"))):
        if not rows:
            continue
        why = ratio_refusal("park", park)
        if why:
            no_ratio[f"park_decode_over_graph_decode{suffix}"] = why
            continue
        assert park is not None
        near = min(rows, key=lambda r: abs(r["batch"] - park["mean_running_requests"]))
        out[f"graph_decode{suffix}_tokens_per_s"] = near["decode_tokens_per_s"]
        out[f"graph_decode{suffix}_batch"] = near["batch"]
        # park's tokens per second of engine time (Generating + Draining) against the graph decode alone
        out[f"ratio_park_decode_over_graph_decode{suffix}"] = (
            park["engine_decode_tokens_per_s"] / near["decode_tokens_per_s"]
        )
    out["no_ratio"] = no_ratio


class JsonReport:
    """The run's JSON, rewritten whole (atomically) after every piece, so a cut run keeps its data."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.data = dict(header)
        self._lock = threading.Lock()

    def update(self, values: dict[str, Any]) -> None:
        """Merge ``values`` into the report and write it."""
        self.data.update(values)
        self.write()

    def write(self) -> None:
        """Write the report (temporary file, then rename)."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str), encoding="utf-8")
            tmp.replace(self.path)


def round_lines(k: int, rounds: int, mode: str, r: dict[str, Any]) -> list[str]:
    """What the bench prints after one round of one mode: its rate and window, what its handoffs found, and (on
    megatron's dynamic engine) its kinds of engine step."""
    rate = r["fresh_samples"] / r["measured_s"] if r["measured_s"] > 0 else float("nan")
    line = (
        f"  round {k + 1}/{rounds} {mode}: {rate:.2f} samples/s over {r['measured_steps']} measured steps (after "
        f"{r['warmup_steps']} warm-up; made {r['fresh_samples']}, trained {r['trained_samples']}), draining "
        f"{sum(r['draining_s']):.2f} of {r['measured_s']:.2f} s, run {r['run_s']:.1f} s"
        f"{' (cut by the budget)' if r['cut_by_budget'] else ''}"
    )
    if "groups_in_flight_at_handoff" in r:
        line += f", groups in flight at its handoffs {r['groups_in_flight_at_handoff']}"
    if "collector_first_waits_s" in r:
        waits = (
            "gave up" if x is None else "<1 ms" if x < 1e-3 else f"{x * 1e3:.0f} ms"
            for x in r["collector_first_waits_s"]
        )
        line += f", collector-first waits {', '.join(waits)}"
    lines = [line + f", load {r['loadavg_start']:.1f}->{r['loadavg_end']:.1f}"]
    prof = r.get("engine_step_profile")
    if prof:
        kinds = [
            f"{kind} {v['share']:.0%} {v['ms_per_step']:.1f} ms {v['mean_active']:.0f} active"
            + (f" (graphs {graph_mix(v['graphs'])})" if v.get("graphs") else "")
            for kind, v in prof.items()
            if isinstance(v, dict)
        ]
        lines.append(
            f"    engine steps: {'; '.join(kinds)}; paused {prof.get('mean_paused', 0):.1f}, "
            f"waiting {prof.get('mean_waiting', 0):.1f} per step"
        )
    return lines


def graph_mix(graphs: dict[str, dict[str, Any]]) -> str:
    """A step profile's steps per captured graph in a few words, largest share first: ``"128: 61% 10.2 ms 66
    decoded, 64: 39% ..."`` (``decoded`` only where megatron said what each step ran)."""
    parts = []
    for size, v in sorted(graphs.items(), key=lambda kv: -kv[1]["share"]):
        ran = f" {v['mean_ran']:.0f} decoded" if "mean_ran" in v else ""
        parts.append(f"{size}: {v['share']:.0%} {v['ms_per_step']:.1f} ms{ran}")
    return ", ".join(parts)


def print_table(out: dict[str, Any]) -> None:
    """The modes side by side, then each ratio (or why there is none)."""
    results = {m: r for m, r in out["modes"].items() if "samples_per_s" in r}
    cols = [
        ("mode", "{}"),
        ("samples_per_s", "{:.2f}"),
        ("spread", "{}"),
        ("steps", "{}"),
        ("draining_share", "{:.3f}"),
        ("handoff_p50_ms", "{:.1f}"),
        ("decode_tokens_per_s", "{:.0f}"),
        ("mean_running", "{:.0f}"),
    ]
    print()
    print("  ".join(f"{c:>19}" if i else f"{c:<10}" for i, (c, _) in enumerate(cols)))
    for m, r in results.items():
        values = {
            **r,
            "spread": spread_text(r),
            "steps": r["measured_steps"],
            "mean_running": r["mean_running_requests"],
        }
        cells = [m] + [fmt.format(values[c]) for c, fmt in cols[1:]]
        print("  ".join(f"{x:>19}" if i else f"{x:<10}" for i, x in enumerate(cells)))
    print()
    for k, v in out.items():
        if k.startswith("ratio_") and not k.endswith("_cpu") and isinstance(v, float):
            print(f"{k} = {v:.2f}")
    for k, why in (out.get("no_ratio") or {}).items():
        print(f"no ratio_{k}: {why}")


__all__ = [
    "ENGINES",
    "MAX_BUFFER_GROWTH",
    "MIN_STEPS",
    "REASONING",
    "SMOKE",
    "JsonReport",
    "Meter",
    "add_ratios",
    "buffer_growth",
    "direct_engine",
    "mode_of_ratio",
    "mode_unavailable",
    "print_table",
    "ratio_name",
    "ratio_refusal",
    "release_model_graphs",
    "spread",
    "spread_text",
    "summarize",
    "unsteady_growth",
]
