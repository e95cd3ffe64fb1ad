"""Park vs drain vs sync vs abort: what a handoff that keeps in-flight rollouts is worth, with heavy-tailed lengths.

One process, up to four modes on one engine: the model, the trainer and the engine (its KV buffer and CUDA graphs)
are built and warmed once (``bench/_rig.py``) and every mode runs its own
:class:`~colo_fsm.machine.lifecycle.Lifecycle` over them, with the same prompts, output lengths and sampling seeds:

* ``park``: an :class:`~colo_fsm.collector.AsyncCollector` (``inflight="park"``) over the continuous-batching
  :class:`~colo_fsm.adapters.megatron.engine.MegatronEngine` (``inflight="park"``): each handoff stops at a
  decode-step boundary, the rollouts in flight stay parked and finish after the step under the new weights;
* ``drain``: the same with ``inflight="drain"`` on both: each handoff waits for every rollout in flight, so
  every step waits for the slowest one;
* ``sync``: no collector: generate the whole batch (tail included), then train; the same lifecycle handoffs;
* ``abort``: the peers' colocated async (``inflight="abort"`` on both): each handoff ends the requests in
  flight, and after it each is resubmitted as prompt + the tokens it had, re-prefilled under the new weights
  (its row reports the requests ended and the KV tokens discarded and re-prefilled);
* ``drain-hold`` (only when named in ``--modes``): drain whose collector starts no rollout while the buffer
  already holds the next step's batch (``AsyncCollector(hold_while_batch_waits=True)``, :data:`HOLD_ADMIT`). In ``drain`` two threads race
  after each resume, the collector admitting and the trainer handing off; when the collector goes first the
  handoff drains what it just admitted, tail included. ``drain-hold`` makes the trainer's handoff go first
  whenever its batch is ready: that handoff drains nothing, and the next generation admits two batches' worth.
  ``--drain-race collector-first`` forces the other outcome in ``drain``: each handoff waits until the collector
  has started every rollout it may (``bench/_handoff.py``'s ``wait_for_admission``; the seconds each waited are
  the row's ``collector_first_waits_s``, None where it gave up). The default, ``free``, forces neither.

What counts (a figure a user can reproduce): each mode runs ``--steps`` measured steps after its warm-up (park,
drain and abort: ``--warmup`` steps, which fill their pipeline and their buffer; sync starts every step empty, so
it needs none once the rig is warm, and draws its prompts from the one after those the others' warm-up trains, so
that every mode's measured steps train the same prompts: ``first_prompt`` in the JSON). ``samples_per_s`` counts
the trained samples *made* inside the measured window (a group that completed before it, e.g. waiting in the
buffer, does not count) per wall-clock second; its spread is given over rounds (``--rounds``, interleaved: two runs
of the same seed) and over single steps. A ratio is printed, and written, only between modes that each ran 3 or
more measured steps in steady state: a window that made more than a fifth more (or less) than it trained was
filling (or emptying) its buffer, so its rate is not the mode's (``buffer_growth``). Otherwise the table and the
JSON (``no_ratio``) say why there is none.

``--workload reasoning`` is the shape of RL for reasoning models (see ``bench/_handoff.py``: 32 x 8 per step,
lengths lognormal median 768 cut at ``--max-len``, 256 active, 40 GiB KV, CUDA graphs, a pure graph-decode
baseline first, from more contexts with ``--graph-contexts``: ``bench/_graph_baseline.py``); ``--smoke`` runs its
code path on the CPU in seconds. ``--mode-budget-s`` bounds each mode; the
JSON is rewritten after every measured step.

Output lengths are lognormal (``--median-tokens``, ``--sigma``), cut at ``--max-tokens``; each request stops
at its drawn length (the tokenizer's end-of-document id lies outside the vocabulary), so the tail is real in every
mode. ``draining_share`` is the fraction of the measured wall-clock the lifecycle spent in Draining (from its
trace); ``handoff_p50_ms`` the median time in Draining per step; ``spanning_rollouts`` the requests whose tokens
came from more than one weight version; ``decode_tokens_per_s`` the tokens generated per wall-clock second;
``groups_in_flight_at_handoff`` the prompt groups in flight as each measured handoff began (the collector's pause),
so a drain figure says which outcome of its race each handoff had (0: the trainer went first).

Usage::

    python bench/inflight_handoff.py --quick                   # CPU, tiny GPT, < 3 min on 2 shared cores
    python bench/inflight_handoff.py --workload reasoning --modes park,drain        # one GPU, reasoning shape
    python bench/inflight_handoff.py --workload reasoning --max-len 32768 --modes park,sync
    python bench/inflight_handoff.py --workload reasoning --smoke                   # its code path, CPU, seconds

Writes ``bench/results/inflight_handoff.json`` (reasoning: ``inflight_handoff_reasoning_<model>_cut<N>_age<A>
.json``; ``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._graph_baseline import baseline_runs, graph_context_errors, graph_decode_baseline  # noqa: E402
from bench._handoff import (  # noqa: E402  (after the sys.path line above)
    MIN_STEPS,
    JsonReport,
    Meter,
    add_ratios,
    mode_unavailable,
    print_table,
    release_model_graphs,
    round_lines,
    summarize,
    wait_for_admission,
)
from bench._handoff_cli import DEFAULT_MODES as DEFAULT_MODES  # noqa: E402  (re-exported: the command line's)
from bench._handoff_cli import parse_args as parse_args  # noqa: E402
from bench._provenance import git_commit  # noqa: E402
from bench._rig import Rig, build_rig  # noqa: E402
from bench._stats import minmax, pct  # noqa: E402
from bench._workload import Shape, first_prompt, output_length, warmup_steps  # noqa: E402
from colo_fsm.adapters.megatron.trainer import Rollout  # noqa: E402

HOLD_ADMIT = "the collector starts a rollout only while the buffer holds less than one batch for the current version"
"""What ``drain-hold`` adds to drain: ``AsyncCollector(hold_while_batch_waits=True)``."""


def policy_of(mode: str) -> str:
    """The in-flight policy a mode runs its collector and engine with (``drain-hold`` is drain's)."""
    return "drain" if mode == "drain-hold" else mode


HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "park/drain samples/s": "ratio_park_over_drain",
    "park/sync samples/s": "ratio_park_over_sync",
    "park/abort samples/s": "ratio_park_over_abort",
    "park/drain-hold samples/s": "ratio_park_over_drain_hold",
}


def _peak_gib(device: str) -> float | None:
    """The CUDA allocator's peak since the mode started (GiB), None on the CPU."""
    if device != "cuda":
        return None
    import torch

    return torch.cuda.max_memory_allocated() / 2**30


def run_mode(
    mode: str,
    rig: Rig,
    args: argparse.Namespace,
    shape: Shape,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One mode on the rig's engine: ``warmup_steps`` steps, then ``shape.steps`` measured ones; returns its row.

    Only samples *made* in the measured window count (``fresh_samples``, what samples/s is computed from): a group
    completed before it (during the warm-up, or waiting in the buffer at its start) does not, and one completed
    inside it does, trained by its end or not (in steady state the buffer holds as much at the end as at the
    start). ``trained_samples`` counts what the measured steps trained. ``on_step`` gets the row so far after every
    measured step (a run cut mid-mode keeps its steps)."""
    from colo_fsm.adapters.batching import Priority
    from colo_fsm.adapters.megatron.engine import to_completion
    from colo_fsm.adapters.megatron.step_profile import window as step_window
    from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, RolloutDeferred, StateTimer, TrajectoryGroup
    from colo_fsm.guards import CheckpointDecision, InFlightCap, ValidationDecision
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
    from colo_fsm.states.spec import State

    tok, engine = rig.tokenizer, rig.engine
    engine.real.set_inflight("park" if mode == "sync" else policy_of(mode))  # sync never suspends with any in flight
    meter = Meter()
    made: list[tuple[float, int]] = []  # (completion time, samples) of every group the engine made
    target = tok.tokenize(tok.alphabet[0])[0]
    w = warmup_steps(mode, shape)
    holder: dict[str, Lifecycle] = {}

    def prompt_stream(first: int) -> Iterator[Prompt]:
        """The seeded prompts from index ``first`` on (the same text at each index in every mode)."""
        rng = random.Random(args.seed)
        i = 0
        while True:
            text = "".join(rng.choice(tok.alphabet) for _ in range(shape.prompt_len))
            if i >= first:
                yield Prompt(f"p{i}", text, {"index": i})
            i += 1

    def submit(prompt: Prompt, j: int) -> Any:
        i = int(prompt.metadata["index"])
        return meter.watch(
            engine.submit(
                tok.tokenize(prompt.text),
                max_tokens=output_length(args.seed, i, j, shape),
                temperature=shape.temperature,
                seed=args.seed * 7919 + i * 131 + j,
                priority=Priority.TRAINING,
            )
        )

    def group_of(prompt: Prompt, outs: list[Any]) -> TrajectoryGroup:
        if any(o.finish_reason == "abort" for o in outs):
            raise RolloutDeferred("the engine was shut down")  # the mode is over; not a failure
        rewards = [sum(1 for t in o.token_ids if t == target) / max(1, len(o.token_ids)) for o in outs]
        samples = [to_completion(o) for o in outs]
        made.append((time.monotonic(), len(samples)))  # when this group's samples were made
        return TrajectoryGroup(
            prompt.prompt_id,
            prompt.text,
            tuple(samples),
            tuple(rewards),
            weight_version=min(s.weight_version for s in samples),
            metadata={"prompt_ids": tok.tokenize(prompt.text), "index": prompt.metadata["index"]},
        )

    async def rollout(prompt: Prompt) -> TrajectoryGroup:
        handles = [submit(prompt, j) for j in range(shape.samples_per_group)]
        try:
            outs = [await h.wait() for h in handles]
        except asyncio.CancelledError:  # the collector's close() after the mode: abort every request, not one
            for h in handles:
                h.future.cancel()
            raise
        return group_of(prompt, outs)

    def to_rollouts(groups: list[TrajectoryGroup]) -> list[Any]:
        out = []
        for g in groups:
            ids = tuple(g.metadata["prompt_ids"])
            for s, r in zip(g.samples, g.rewards):
                out.append(Rollout(ids, tuple(s.token_ids), r, g.prompt_id, tuple(s.logprobs), g.weight_version))
        return out

    pauses: list[tuple[float, int]] = []  # (when, prompt groups in flight) at each pause: a handoff's first action
    forced = mode == "drain" and args.drain_race == "collector-first"
    admission_waits: list[float | None] = []  # per step, when forced: seconds its handoff waited for the collector

    class HandoffCountingCollector(AsyncCollector):
        """The collector, noting how many rollouts were in flight when each handoff began. In drain that is
        what the handoff waits for: 0 is the race's trainer-first outcome (the module's docstring)."""

        def pause(self) -> None:
            began = time.monotonic()
            super().pause()
            pauses.append((began, self.stats().in_flight_at_pause))

    buffer = collector = None
    if mode != "sync":
        buffer = ReplayBuffer(shape.num_prompts_per_step, shape.max_trajectory_age_steps, order=shape.buffer_order)
        collector = HandoffCountingCollector(
            rollout,
            prompt_stream(first_prompt(mode, shape)),
            buffer,
            weight_version=rig.weight_version,
            cap=InFlightCap(
                shape.num_prompts_per_step, shape.max_trajectory_age_steps, samples_per_group=shape.samples_per_group
            ),
            admit=lambda: holder["lc"].state is State.GENERATING,
            inflight=policy_of(mode),
            hold_while_batch_waits=mode == "drain-hold",  # HOLD_ADMIT
            name=f"bench-{mode}",
        )
    lc = holder["lc"] = Lifecycle(
        engine,
        rig.trainer,
        collector,
        config=LifecycleConfig(num_steps=w + shape.steps),
        checkpoint=CheckpointDecision(None),
        validation=ValidationDecision(None),
    )
    rig.version["source"] = lambda: lc.weight_version
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
    stream = prompt_stream(first_prompt(mode, shape))
    step_ends: list[float] = []
    step_cpu: list[float] = []
    decode_steps: list[int] = []
    consumed: list[int] = []
    spans: list[int] = []
    trained_prompts: list[int] = []  # the stream index of every group trained, step after step
    times: list[dict[str, float]] = []  # seconds per state, per finished step
    stats0 = engine.inflight_stats() if hasattr(engine.real, "inflight_stats") else None
    profile_of = getattr(engine.real, "step_profile", lambda: None)  # megatron's dynamic engine: kinds of step
    profiles: list[dict[str, float] | None] = []  # its sums at each step's end
    pause_steps: list[int] = getattr(engine.real, "pause_steps", [])  # the coordinator loop's, appended per suspend
    pauses_at: list[int] = []  # how many pauses the engine had recorded at each step's end
    pauses_ready = 0
    profile_ready: dict[str, float] | None = None
    if args.device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    t_start = time.monotonic()
    cpu_start = time.process_time()
    load_start = os.getloadavg()
    steps0 = engine.steps
    cut = False
    t_ready = cpu_ready = 0.0

    def made_between(a: float, b: float) -> int:
        return sum(n for t, n in list(made) if a < t <= b)

    def row() -> dict[str, Any]:
        """The mode's row from the steps measured so far."""
        n = len(consumed) - w
        t0 = step_ends[w - 1] if w else t_ready
        t1 = step_ends[-1] if n > 0 else t0
        c0 = step_cpu[w - 1] if w else cpu_ready
        c1 = step_cpu[-1] if n > 0 else c0
        times.extend(timer.pop_completed())
        measured = times[w:]
        rows = meter.window(t0, t1)
        occ = [(r, q) for t, r, q in occupancy if t0 <= t <= t1]
        ends = [t0, *step_ends[w:]]
        out = {
            "occupancy_samples": len(occ),
            "active_sum": sum(r for r, _ in occ),
            "idle_samples": sum(1 for r, _ in occ if r == 0),
            "measured_s": t1 - t0,
            "trained_samples": sum(consumed[w:]),
            "fresh_samples": made_between(t0, t1),
            "step_samples_per_s": [made_between(a, b) / max(1e-9, b - a) for a, b in itertools.pairwise(ends)],
            "state_s": {k: sum(d.get(k, 0.0) for d in measured) for k in sorted({k for d in measured for k in d})},
            "draining_s": [d.get(State.DRAINING.value, 0.0) for d in measured],
            "spanning_rollouts": sum(1 for r in rows if r[2] > 0),
            "max_version_span": max((r[2] for r in meter.window(t_start, t1)), default=0),
            "decode_tokens": sum(r[1] for r in rows),
            "decode_steps": (decode_steps[-1] - (decode_steps[w - 1] if w else steps0)) if n > 0 else 0,
            "spanning_groups_trained": sum(1 for x in spans[w * shape.num_prompts_per_step :] if x > 0),
            # the first and last stream index the measured steps trained: every mode's, by first_prompt, the same
            "trained_prompts": minmax(trained_prompts[w * shape.num_prompts_per_step :]),
            "measured_steps": max(0, n),
            "engine_backend": engine.backend_name,
            "run_s": time.monotonic() - t_start,
            "cpu_s": c1 - c0,  # this process's CPU time over the measured window (all threads)
            "loadavg_start": load_start[0],
            "loadavg_end": os.getloadavg()[0],
            "cut_by_budget": cut,
            "warmup_steps": w,
            "peak_allocated_gib": _peak_gib(args.device),
            "cpu_s_total": time.process_time() - cpu_start,
        }
        p0 = profiles[w - 1] if w else profile_ready
        p1 = profiles[-1] if n > 0 else p0
        if p0 is not None and p1 is not None:
            out["engine_step_profile"] = step_window(p0, p1)
        if hasattr(engine.real, "pause_steps"):  # the coordinator loop: its steps from asking a pause to SUSPENDED
            a = pauses_at[w - 1] if w else pauses_ready
            out["pause_steps"] = list(pause_steps[a : pauses_at[-1] if n > 0 else a])
        if stats0 is not None:
            now = engine.inflight_stats()
            out["inflight_stats"] = {k: getattr(now, k) - getattr(stats0, k) for k in now._fields}
        if collector is not None:  # sync has none: each of its handoffs comes after the whole batch
            out["groups_in_flight_at_handoff"] = [n for t, n in list(pauses) if t0 < t <= t1]
            out["collector"] = {
                k: v
                for k, v in asdict(collector.stats()).items()
                if k in ("started", "completed", "spanning", "failed")
            }
        if forced:
            out["collector_first_waits_s"] = admission_waits[w:]
        return out

    try:
        lc.start()
        t_ready = time.monotonic()
        cpu_ready = time.process_time()
        profile_ready = profile_of()
        pauses_ready = len(pause_steps)
        sampler.start()
        while not lc.finished:
            if args.mode_budget_s is not None and len(step_ends) > w:
                last = step_ends[-1] - (step_ends[-2] if len(step_ends) > 1 else t_ready)
                if time.monotonic() - t_start + last > args.mode_budget_s:
                    cut = True  # another step like the last would overrun the mode's budget: stop here
                    break
            if buffer is not None:
                groups = buffer.sample(lc.weight_version, timeout=args.sample_timeout)
                if forced:  # the race's collector-first outcome: the handoff starts once admission is done
                    admission_waits.append(wait_for_admission(buffer, collector))
            else:  # sync: the whole batch, tail included, then train
                prompts = [next(stream) for _ in range(shape.num_prompts_per_step)]
                handles = [[submit(p, j) for j in range(shape.samples_per_group)] for p in prompts]
                groups = [group_of(p, [h.result() for h in hs]) for p, hs in zip(prompts, handles)]
            batch = to_rollouts(groups)
            result = lc.step(batch)
            step_ends.append(time.monotonic())
            step_cpu.append(time.process_time())
            decode_steps.append(engine.steps)
            profiles.append(profile_of())
            pauses_at.append(len(pause_steps))
            consumed.append(result.consumed_samples)
            spans += [g.version_span for g in groups]
            trained_prompts += [int(g.metadata["index"]) for g in groups]
            if args.verbose:
                counts = engine.request_counts()
                print(
                    f"  {mode} step {lc.step_index}: {result.consumed_samples} samples trained, "
                    f"queued/running/parked={counts.queued}/{counts.running}/{counts.parked}",
                    flush=True,
                )
            if on_step is not None and len(consumed) > w:
                on_step(row())
    finally:
        stop_sampling.set()
        try:
            lc.stop()
        finally:
            rig.settle(close=collector.close if collector is not None else None)
    return row()


def consensus_interval(args: Any) -> int:
    """The ``ep_consensus_interval`` a coordinator run's loop gets (the bench's model runs at expert parallelism 1):
    ``--ep-consensus-interval``, else colo-fsm's default there."""
    from colo_fsm.adapters.megatron.coordinator_config import CoordinatorConfig

    interval = CoordinatorConfig(ep_consensus_interval=args.ep_consensus_interval).consensus_interval(1)
    assert interval is not None  # set at expert parallelism 1
    return interval


def main(argv: list[str] | None = None) -> int:
    """Run the modes (and, on a GPU with graphs, the pure graph-decode baseline first); print the table; write
    the JSON after every mode, so a run cut short keeps what it measured."""
    args, model_name, shape, modes = parse_args(argv)
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
        f"inflight_handoff: model={model_name} workload={args.workload} device={args.device} engine={args.engine} "
        f"steps={shape.steps} (warmup {shape.warmup}) budget/mode={args.mode_budget_s} "
        f"batch={shape.num_prompts_per_step}x{shape.samples_per_group} max_age={shape.max_trajectory_age_steps} "
        f"active={shape.max_active_requests} kv={args.buffer_gb} GiB graphs={args.cuda_graphs}; "
        f"output lengths lognormal(median {shape.median_tokens:g}, sigma {shape.sigma:g}) cut at {shape.max_tokens}: "
        f"p50 {pct(lengths, 50):.0f}, p90 {pct(lengths, 90):.0f}, p99 {pct(lengths, 99):.0f}, "
        f"mean {statistics.fmean(lengths):.1f}",
        flush=True,
    )
    rounds = args.rounds or (4 if args.quick else 3)
    report = JsonReport(
        args.out,
        {
            # no mode runs with --graph-only: not a handoff run, and the page does not count it as one
            "benchmark": "graph_decode" if args.graph_only else "inflight_handoff",
            "workload": args.workload,
            "command": " ".join([Path(sys.executable).name, "bench/inflight_handoff.py", *(argv or sys.argv[1:])]),
            "commit": git_commit(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            **({"drain_hold_admission": HOLD_ADMIT} if "drain-hold" in modes else {}),
            **({"drain_race": args.drain_race} if "drain" in modes else {}),
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
            "seed": args.seed,
            "kv_buffer_gb": args.buffer_gb,
            "num_cuda_graphs": args.cuda_graphs,
            "cuda_graph_sizing": args.graph_sizing,  # None: megatron's default (exponential)
            **({"ep_consensus_interval": consensus_interval(args)} if args.engine == "coordinator" else {}),
            "shape": asdict(shape),
            "output_lengths": {
                "p50": pct(lengths, 50),
                "p90": pct(lengths, 90),
                "p99": pct(lengths, 99),
                "max": max(lengths),
                "mean": statistics.fmean(lengths),
            },
            **(
                {}
                if args.graph_only
                else {
                    "engine": args.engine,
                    "rounds": rounds,
                    "min_steps_for_a_ratio": MIN_STEPS,
                    "mode_budget_s": args.mode_budget_s,
                    "warmup_steps": {m: warmup_steps(m, shape) for m in modes},
                    # the first prompt each mode draws: sync skips what the others' warm-up trains
                    # (_workload.first_prompt)
                    "first_prompt": {m: first_prompt(m, shape) for m in modes},
                    "modes": {},
                }
            ),
        },
    )
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    t_all = time.monotonic()
    rig: Rig | None = None

    def publish(mode: str, partial: dict[str, Any] | None = None) -> None:
        """The mode's row (rounds so far, plus the round in progress) and the ratios, written at once."""
        done = runs[mode] + ([partial] if partial is not None else [])
        if done and any(r["measured_steps"] for r in done):
            report.data["modes"][mode] = summarize([r for r in done if r["measured_steps"]])
        add_ratios(report.data)
        report.data["total_s"] = time.monotonic() - t_all
        report.write()  # what is measured so far, in case the run is cut short (a time-limited GPU call)

    try:
        if baseline_runs(args):
            report.update(graph_decode_baseline(args, shape, model_name, lengths))
            print(f"  graph-decode baseline: {report.data['graph_decode']}", flush=True)
        if args.graph_only:
            if not baseline_runs(args):
                report.data["graph_decode_not_run"] = "the graph-decode baseline runs on a GPU with CUDA graphs"
                print(f"  graph-decode baseline: not run ({report.data['graph_decode_not_run']})", flush=True)
            report.data["total_s"] = time.monotonic() - t_all
            report.write()
            print(f"total {report.data['total_s']:.0f} s; wrote {args.out}")
            if failed := graph_context_errors(report.data):
                print(f"these graph-decode rows failed: {'; '.join(failed)}", flush=True)
                return 1
            return 0
        rig = build_rig(args, shape)
        report.update({"rig": {"build_s": rig.build_s, "warm_s": rig.warm_s}})
        print(f"  engine built in {rig.build_s:.1f} s, warmed in {rig.warm_s:.1f} s (shared by every mode)", flush=True)
        for k in range(rounds):  # interleaved, so a busy moment of a shared machine hits every mode alike
            for mode in modes:
                why = mode_unavailable(mode)
                if why:
                    print(f"  {mode}: skipped ({why})", flush=True)
                    report.data["modes"][mode] = {"skipped": why}
                    report.write()
                    continue
                r = run_mode(mode, rig, args, shape, on_step=lambda row, m=mode: publish(m, row))  # type: ignore[misc]
                runs[mode].append(r)
                print("\n".join(round_lines(k, rounds, mode, r)), flush=True)
                report.data["rounds_done"] = k + (mode == modes[-1])
                publish(mode)
    finally:
        try:
            if rig is not None:
                rig.close()
                if args.cuda_graphs is not None:
                    # megatron-core keeps the captured graphs, and with them the engine's KV buffer, in
                    # process-wide records
                    release_model_graphs(rig.model)
        finally:
            shutdown_distributed()
    print_table(report.data)
    print(f"total {report.data.get('total_s', 0.0):.0f} s; wrote {args.out}")
    if failed := graph_context_errors(report.data):
        print(f"these graph-decode rows failed: {'; '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
