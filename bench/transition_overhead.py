"""Overhead of the lifecycle machine per transition, against hand-written dispatch doing the same calls.

Both sides drive the same no-op adapters (engine, trainer, collector, drain, barrier, latched decisions) in
the same order; the machine adds what it is for: guards read from latched facts, the handoff ledger, the
per-transition trace record, action timing and ``transitions``' own dispatch. Two cycles are timed:

* ``plain``: a training step without save or validation -- begin_step, train, conclude, resume
  (Generating -> Draining -> Training -> Waking -> Generating, 4 transitions);
* ``ckpt_validate``: a step that saves and validates -- begin_step, train, conclude, conclude,
  end_validation (Generating -> Draining -> Training -> Checkpointing -> Validating -> Generating, 5).

Machine and baseline run side by side in one process, interleaved over repeated rounds (the order flips each
round); the table reports medians. Before timing, both sides run once with recording fakes and must make the
same adapter calls in the same order, so the baseline is a faithful hand-written equivalent.

Usage::

    python bench/transition_overhead.py                  # full run (about 10 s), writes bench/results/...
    python bench/transition_overhead.py --quick          # a few seconds, same output format
    python bench/transition_overhead.py --profile        # plus a cProfile of the machine's plain cycle
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from colo_fsm.adapters.protocols import StepResult  # noqa: E402
from colo_fsm.guards.barrier import SoloBarrier  # noqa: E402
from colo_fsm.guards.decision import CheckpointDecision, ValidationDecision  # noqa: E402
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig  # noqa: E402
from colo_fsm.states.spec import State  # noqa: E402

TARGET_US = 50.0
TARGET_RATIO = 3.0  # the machine per transition, at most this many times a bare transitions.Machine's
RESULTS = ROOT / "bench" / "results" / "transition_overhead.json"
TRANSITIONS = {"plain": 4, "ckpt_validate": 5}
_RESULT = StepResult()
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "plain: machine us/transition": "results.plain.machine.median_us",
    "plain: machine / bare transitions": "results.plain.ratio_to_transitions",
    "plain: machine / bare transitions, CPU time": "results.plain.cpu.ratio_to_transitions",
    "ckpt_validate: machine us/transition": "results.ckpt_validate.machine.median_us",
    "ckpt_validate: machine / bare transitions": "results.ckpt_validate.ratio_to_transitions",
    "ckpt_validate: machine / bare transitions, CPU time": "results.ckpt_validate.cpu.ratio_to_transitions",
}


# ---------------------------------------------------------------------------------------------- no-op adapters
class NoopEngine:
    reads_weights_in_place = True

    def bring_up(self) -> None:
        pass

    def suspend(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def server_base_urls(self) -> list[str]:
        return []


class NoopTrainer:
    def train_step(self, batch: Any) -> StepResult:
        return _RESULT

    def offload_buffers(self) -> None:
        pass

    def restore_buffers(self) -> None:
        pass

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        pass


class NoopCollector:
    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


def noop_drain() -> int:
    return -1


@dataclass
class Adapters:
    engine: Any
    trainer: Any
    collector: Any
    drain: Callable[[], object]
    barrier: Any


def noop_adapters() -> Adapters:
    return Adapters(NoopEngine(), NoopTrainer(), NoopCollector(), noop_drain, SoloBarrier())


# ---------------------------------------------------------------------------------------------- baseline
class HandWritten:
    """The same lifecycle as plain if/else code: the dispatch a framework writes inline in its loop."""

    def __init__(self, a: Adapters, checkpoint: CheckpointDecision, validation: ValidationDecision) -> None:
        self.a = a
        self.checkpoint = checkpoint
        self.validation = validation
        self.state = "Created"
        self.step_index = 0
        self.weight_version = 0
        self.save = self.validate = self.last = False

    def start(self) -> None:
        if self.state != "Created":
            raise RuntimeError(f"start in {self.state}")
        a = self.a
        a.engine.bring_up()
        a.engine.server_base_urls()
        a.drain()
        a.barrier.wait(state="Starting", weight_version=self.weight_version)
        a.collector.resume()
        self.state = "Generating"

    def begin_step(self) -> None:
        if self.state != "Generating":
            raise RuntimeError(f"begin_step in {self.state}")
        step = self.step_index
        self.save = self.checkpoint.decide(step)
        self.validate = self.validation.decide(step)
        self.last = self.checkpoint.stops_run(step)
        a = self.a
        a.collector.pause()
        a.engine.suspend()
        a.drain()
        a.barrier.wait(state="Draining", weight_version=self.weight_version)
        self.state = "Draining"

    def train(self, batch: Any) -> None:
        if self.state != "Draining":
            raise RuntimeError(f"train in {self.state}")
        a = self.a
        a.trainer.restore_buffers()
        a.trainer.train_step(batch)
        self.weight_version += 1
        self.step_index += 1
        a.trainer.offload_buffers()
        a.drain()
        if self.save:
            a.barrier.wait(state="Checkpointing", weight_version=self.weight_version)
            a.trainer.save_checkpoint(self.step_index, self.weight_version, {})
            a.drain()
            a.barrier.wait(state="Checkpointing", weight_version=self.weight_version)
            if self.validate:
                a.engine.resume()
                self.state = "Validating"
                return
        elif self.validate:
            a.barrier.wait(state="Validating", weight_version=self.weight_version)
            a.engine.resume()
            self.state = "Validating"
            return
        else:
            a.barrier.wait(state="Waking", weight_version=self.weight_version)
        a.engine.resume()
        a.collector.resume()
        self.state = "Generating"

    def end_validation(self) -> None:
        if self.state != "Validating":
            raise RuntimeError(f"end_validation in {self.state}")
        self.a.collector.resume()
        self.state = "Generating"


class TransitionsOnly:
    """The floor set by the ``transitions`` library: the same states and guarded edges on a plain ``Machine``
    (``auto_transitions=False``, guards reading a dict of facts, a no-op ``after`` callback), no actions, no
    trace. The difference between this and the machine is what :class:`Lifecycle` itself adds."""

    def __init__(self, kind: str) -> None:
        from transitions import Machine

        from colo_fsm.states.spec import LIFECYCLE, Fact

        facts = dict.fromkeys(Fact, False)
        facts.update({Fact.ENGINE_BUILT: True, Fact.HANDOFF_COMPLETE: True, Fact.STEP_TRAINED: True})
        if kind == "ckpt_validate":
            facts.update({Fact.SAVE_THIS_STEP: True, Fact.VALIDATE_THIS_STEP: True})

        def reader(f: Fact) -> Callable[..., bool]:
            return lambda *_a, **_k: facts[f]

        def after(*_a: Any, **_k: Any) -> None:
            pass

        class Model:
            state = State.GENERATING.value

        self.model: Any = Model()
        machine = Machine(
            model=self.model,
            states=[s.state.value for s in LIFECYCLE.states],
            initial=State.GENERATING.value,
            auto_transitions=False,
        )
        for t in LIFECYCLE.transitions:
            machine.add_transition(
                t.trigger,
                t.source.value,
                t.dest.value,
                conditions=[reader(f) for f in t.when],
                unless=[reader(f) for f in t.unless],
                after=after,
            )
        self.after_train = ("conclude", "resume") if kind == "plain" else ("conclude", "conclude")

    def begin_step(self) -> None:
        self.model.trigger("begin_step")

    def train(self, batch: Any) -> None:
        trigger = self.model.trigger
        trigger("train")
        for name in self.after_train:
            trigger(name)

    def end_validation(self) -> None:
        self.model.trigger("end_validation")


# ---------------------------------------------------------------------------------------------- drivers
def decisions(kind: str) -> tuple[CheckpointDecision, ValidationDecision]:
    every = 1 if kind == "ckpt_validate" else None
    return CheckpointDecision(every), ValidationDecision(every)


def make_machine(kind: str, a: Adapters) -> Lifecycle:
    ck, va = decisions(kind)
    lc = Lifecycle(
        a.engine,
        a.trainer,
        a.collector,
        config=LifecycleConfig(),
        drain=a.drain,
        barrier=a.barrier,
        checkpoint=ck,
        validation=va,
    )
    lc.start()
    return lc


def make_baseline(kind: str, a: Adapters) -> HandWritten:
    ck, va = decisions(kind)
    hw = HandWritten(a, ck, va)
    hw.start()
    return hw


def make_transitions_only(kind: str, a: Adapters) -> TransitionsOnly:
    return TransitionsOnly(kind)


DRIVERS: dict[str, Callable[[str, Adapters], Any]] = {
    "machine": make_machine,
    "baseline": make_baseline,
    "transitions_only": make_transitions_only,
}


def run_cycles(driver: Any, kind: str, cycles: int) -> None:
    batch = (0,)
    begin, train = driver.begin_step, driver.train
    if kind == "plain":
        for _ in range(cycles):
            begin()
            train(batch)
    else:
        end = driver.end_validation
        for _ in range(cycles):
            begin()
            train(batch)
            end()


class RecordingBarrier:
    """A solo barrier that records each wait in a fakes journal."""

    def __init__(self, journal: Any) -> None:
        self.journal = journal

    def wait(self, *, state: str | None = None, weight_version: int | None = None) -> None:
        self.journal.add("barrier", "wait")


def check_equivalent(kind: str, cycles: int = 3) -> list[str]:
    """Run machine and baseline with recording fakes; both must make the same adapter calls in order."""
    from colo_fsm.testing.fakes import recording_adapters

    journals = []
    for make in (make_machine, make_baseline):
        j, engine, trainer, collector, drain = recording_adapters()

        driver = make(kind, Adapters(engine, trainer, collector, drain, RecordingBarrier(j)))
        run_cycles(driver, kind, cycles)
        if make is make_machine:
            assert driver.state is State.GENERATING, driver.state
        journals.append(j.methods())
    if journals[0] != journals[1]:
        raise AssertionError(
            f"{kind}: the baseline does not make the machine's calls:\n  machine:  "
            f"{journals[0]}\n  baseline: {journals[1]}"
        )
    return journals[0]


def time_once(make: Callable[[str, Adapters], Any], kind: str, cycles: int) -> tuple[float, float]:
    """Seconds per transition for one timed block of ``cycles`` cycles on a fresh driver: wall-clock, and this
    thread's CPU time (every side runs on the calling thread, so CPU time leaves out the time the process waited
    for a core: on a busy machine the wall-clock figures grow several-fold, the CPU-time ones much less)."""
    driver = make(kind, noop_adapters())
    run_cycles(driver, kind, 20)  # warm up
    gc.collect()
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    run_cycles(driver, kind, cycles)
    elapsed = time.perf_counter_ns() - t0
    cpu = time.thread_time_ns() - c0
    n = cycles * TRANSITIONS[kind]
    return elapsed / 1e9 / n, cpu / 1e9 / n


def paired_ratio(machine: list[float], floor: list[float]) -> dict[str, float]:
    """Median, quartiles and range of the per-round ratios ``machine[i] / floor[i]`` (the two ran back to back in
    round ``i``, so load drift between rounds cancels)."""
    per_round = sorted(x / y for x, y in zip(machine, floor, strict=True))
    q = statistics.quantiles(per_round, n=4) if len(per_round) >= 2 else per_round * 3
    return {
        "median": statistics.median(per_round),
        "p25": q[0],
        "p75": q[2],
        "min": per_round[0],
        "max": per_round[-1],
    }


def summarize(samples: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples)
    q = statistics.quantiles(us, n=4) if len(us) >= 4 else [us[0], statistics.median(us), us[-1]]
    return {"median_us": statistics.median(us), "min_us": us[0], "p25_us": q[0], "p75_us": q[2], "max_us": us[-1]}


def profile_machine(kind: str, cycles: int, top: int = 25) -> str:
    driver = make_machine(kind, noop_adapters())
    prof = cProfile.Profile()
    prof.enable()
    run_cycles(driver, kind, cycles)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the JSON; returns 0 (1 if the target is missed)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per scenario (default 15)")
    ap.add_argument("--cycles", type=int, default=400, help="cycles per timed block (default 400)")
    ap.add_argument("--quick", action="store_true", help="5 rounds of 200 cycles")
    ap.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the machine's plain cycle")
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    if args.quick:
        args.rounds, args.cycles = 5, 200
    if args.rounds < 1 or args.cycles < 1:
        ap.error("--rounds and --cycles must be >= 1")

    for kind in TRANSITIONS:
        check_equivalent(kind)

    results: dict[str, Any] = {}
    t_start = time.perf_counter()
    for kind in TRANSITIONS:
        samples: dict[str, list[float]] = {name: [] for name in DRIVERS}
        cpu: dict[str, list[float]] = {name: [] for name in DRIVERS}
        for r in range(args.rounds):
            order = list(DRIVERS.items())
            shift = r % len(order)  # rotate who goes first each round
            for name, make in order[shift:] + order[:shift]:
                wall_s, cpu_s = time_once(make, kind, args.cycles)
                samples[name].append(wall_s)
                cpu[name].append(cpu_s)
        m, b, f = (summarize(samples[n]) for n in DRIVERS)
        per_round = paired_ratio(samples["machine"], samples["transitions_only"])
        per_round_cpu = paired_ratio(cpu["machine"], cpu["transitions_only"])
        results[kind] = {
            "transitions_per_cycle": TRANSITIONS[kind],
            "machine": m,
            "baseline": b,
            "transitions_only": f,
            "ratio": m["median_us"] / b["median_us"] if b["median_us"] > 0 else float("inf"),
            "ratio_to_transitions": per_round["median"],  # the median of the per-round ratios
            "ratio_of_medians_to_transitions": m["median_us"] / f["median_us"],
            "ratio_to_transitions_per_round": per_round,
            "cpu": {  # the same blocks timed by this thread's CPU time (time waiting for a core left out)
                "machine": summarize(cpu["machine"]),
                "baseline": summarize(cpu["baseline"]),
                "transitions_only": summarize(cpu["transitions_only"]),
                "ratio_to_transitions": per_round_cpu["median"],
                "ratio_to_transitions_per_round": per_round_cpu,
            },
            "overhead_us": m["median_us"] - b["median_us"],
            "lifecycle_share_us": m["median_us"] - f["median_us"],
        }
    wall = time.perf_counter() - t_start

    worst = max(r["machine"]["median_us"] for r in results.values())
    worst_ratio = max(r["cpu"]["ratio_to_transitions"] for r in results.values())
    passed = worst < TARGET_US and worst_ratio <= TARGET_RATIO
    print(f"transition overhead: median of {args.rounds} interleaved rounds x {args.cycles} cycles, no-op adapters")
    header = (
        f"{'cycle':<14} {'trans.':>6} {'machine':>9} {'baseline':>9} {'ratio':>6} {'overhead':>9} "
        f"{'transitions lib':>16} {'Lifecycle adds':>15} {'machine /':>10}"
    )
    print(header)
    print(
        f"{'':<14} {'/cycle':>6} {'us/tr':>9} {'us/tr':>9} {'':>6} {'us/tr':>9} {'alone us/tr':>16} {'us/tr':>15} "
        f"{'transitions':>10}"
    )
    for kind, r in results.items():
        print(
            f"{kind:<14} {r['transitions_per_cycle']:>6} {r['machine']['median_us']:>9.2f} "
            f"{r['baseline']['median_us']:>9.3f} {r['ratio']:>5.0f}x {r['overhead_us']:>9.2f} "
            f"{r['transitions_only']['median_us']:>16.2f} {r['lifecycle_share_us']:>15.2f} "
            f"{r['ratio_to_transitions']:>9.2f}x"
        )
    verdict = "PASS" if worst < TARGET_US else "MISS"
    print(f"target < {TARGET_US:g} us per transition: {verdict} (worst machine median {worst:.2f} us)")
    print("by this thread's CPU time (the time spent waiting for a core left out):")
    print(f"{'cycle':<14} {'machine us/tr':>14} {'transitions us/tr':>18} {'machine / transitions (range)':>30}")
    for kind, r in results.items():
        c = r["cpu"]
        rng = c["ratio_to_transitions_per_round"]
        print(
            f"{kind:<14} {c['machine']['median_us']:>14.2f} {c['transitions_only']['median_us']:>18.2f} "
            f"{c['ratio_to_transitions']:>16.2f}x ({rng['min']:.2f}-{rng['max']:.2f})"
        )
    verdict = "PASS" if worst_ratio <= TARGET_RATIO else "MISS"
    print(
        f"target <= {TARGET_RATIO:g}x a bare transitions.Machine (CPU time, median of the per-round ratios): "
        f"{verdict} (worst {worst_ratio:.2f}x)"
    )

    payload = {
        "provenance": prov,
        "benchmark": "transition_overhead",
        "unit": "microseconds per transition (median over rounds)",
        "target_us": TARGET_US,
        "target_ratio_to_transitions": TARGET_RATIO,
        "pass": passed,
        "rounds": args.rounds,
        "cycles_per_round": args.cycles,
        "wall_s": round(wall, 3),
        "results": results,
        "environment": {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "machine": platform.machine(),
            "system": platform.system(),
            "cpu_count": os.cpu_count(),
            "transitions": _version("transitions"),
            "colo_fsm": _version("colo-fsm"),
        },
        "loadavg": list(os.getloadavg()),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    if args.profile:
        print(profile_machine("plain", max(args.cycles, 500)))
    return 0 if passed else 1


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
