"""Fault injection: an exception, a hang or a dead rank at every action of every transition, across ranks.

:class:`FaultyLifecycle` is a :class:`~colo_fsm.machine.lifecycle.Lifecycle` that injects one fault at one
:class:`FaultPoint` (a transition and one of its actions). :func:`run_ranks` runs a :class:`Scenario` on N thread
ranks meeting at a :class:`~colo_fsm.guards.barrier.ThreadBarrier` with one rank faulty, and
:func:`check_outcome` says what went wrong, if anything:

* the faulty rank ends in Failed with an error naming the state, its rank and the weight version (or, for a hang
  with no barrier left to notice it, finishes late but cleanly);
* every peer either finishes (no barrier left that needs the faulty rank) or ends in Failed with a
  :class:`~colo_fsm.errors.BarrierTimeout` naming *its* state, rank and weight version; no rank hangs;
* every failed rank is left in the documented condition (``Lifecycle._quiesce_after_failure``): engine not awake,
  collector paused;
* no checkpoint is lost or half-written (an atomic on-disk trainer; every save the machine completed is on disk,
  complete), and no trajectory is lost (every batch handed to a step was trained on or is still the caller's).

:func:`gloo_fault_worker` is the same on two real gloo processes with a :class:`~colo_fsm.guards.barrier.TorchBarrier`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from colo_fsm.errors import ActionFailed, BarrierTimeout, LifecycleError
from colo_fsm.guards.barrier import ThreadBarrier
from colo_fsm.guards.decision import LatchedDecision
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec, Role, State
from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingEngine, RecordingTrainer
from colo_fsm.testing.scenarios import StepPlan
from colo_fsm.testing.watch import InjectedFault

S = State


class FaultKind(StrEnum):
    """What happens at the fault point."""

    RAISE = "raise"  # the action raises before doing anything
    RAISE_AFTER = "raise_after"  # the action completes, then raises
    HANG = "hang"  # the action blocks (until released) - peers hit their barrier timeout
    DIE = "die"  # the rank stops calling: its thread ends without a word (a killed process)


class RankDied(BaseException):
    """Raised in a thread rank to end it without the lifecycle noticing (what a killed process looks like)."""


class LoopInterrupt(BaseException):
    """The training loop interrupted right where the machine entered a state (a KeyboardInterrupt, a bug in the
    loop): the scenario's ``stop_in``. The loop then stops the run from there."""


@dataclass(frozen=True)
class FaultPoint:
    """One action of one transition; ``action=None`` means "while resting in ``dest``" (DIE only)."""

    trigger: str
    source: State
    dest: State
    action: str | None

    def label(self) -> str:
        if self.action is None:
            return f"resting in {self.dest.value}"
        return f"{self.trigger}: {self.source.value} -> {self.dest.value} · {self.action}"


@dataclass(frozen=True)
class Scenario:
    """A scripted run: the steps' latched decisions, then how it stops.

    ``num_steps`` None keeps the run open-ended; ``end_validation`` False leaves a validating step resting in
    Validating; ``start`` False stops before anything was built; ``fail_first`` makes the collector's pause fail
    at the first step, so the run stops from Failed; ``stop_in``: the loop is interrupted as soon as the machine
    enters that state (after the actions of the transition into it) and stops the run from there, handing the
    batch of the step under way back (``stop(unused=batch)``).
    """

    name: str
    steps: tuple[StepPlan, ...] = ()
    num_steps: int | None = None
    end_validation: bool = True
    start: bool = True
    fail_first: bool = False
    stop_in: State | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "all-step-kinds",
        (StepPlan(), StepPlan(save=True), StepPlan(validate=True), StepPlan(True, True), StepPlan()),
        num_steps=5,
    ),
    Scenario("last-step-saves", (StepPlan(), StepPlan(save=True, validate=True)), num_steps=2),
    Scenario("stop-while-generating", (StepPlan(),)),
    Scenario("stop-while-validating", (StepPlan(validate=True),), end_validation=False),
    Scenario("stop-before-start", start=False),
    Scenario("stop-after-failure", (StepPlan(),), fail_first=True),
    Scenario("stop-in-starting", (StepPlan(),), stop_in=S.STARTING),
    Scenario("stop-in-draining", (StepPlan(),), stop_in=S.DRAINING),
    Scenario("stop-in-training", (StepPlan(),), stop_in=S.TRAINING),
    Scenario("stop-in-checkpointing", (StepPlan(save=True),), stop_in=S.CHECKPOINTING),
    Scenario("stop-in-waking", (StepPlan(),), stop_in=S.WAKING),
)
"""Between them every transition of the shipped lifecycle runs (a stop from every state included)."""


class FaultyLifecycle(Lifecycle):
    """A :class:`Lifecycle` that injects one fault at one point (testing only).

    The fault fires at the ``occurrence``-th time the point runs. ``release`` ends a hang (it is also bounded by
    ``hang_limit_s``); ``die`` (optional) runs before a DIE fault raises :class:`RankDied` (a subprocess rank
    can ``os._exit`` there). ``fired`` is set once the fault fired.
    """

    def __init__(
        self,
        *args: Any,
        fault: FaultPoint | None = None,
        kind: FaultKind = FaultKind.RAISE,
        release: threading.Event | None = None,
        hang_limit_s: float = 60.0,
        die: Callable[[], None] | None = None,
        occurrence: int = 1,
        on_fire: Callable[[], None] | None = None,
        interrupt_in: State | None = None,
        **kwargs: Any,
    ) -> None:
        self.interrupt_in = interrupt_in
        self.fault = fault
        self._on_fire = on_fire
        self.occurrence = occurrence
        self._seen = 0
        self.fault_kind = FaultKind(kind)
        self.release = release or threading.Event()
        self.hang_limit_s = hang_limit_s
        self.fired = threading.Event()
        self._die = die
        super().__init__(*args, **kwargs)

    def _bind_actions(self) -> dict[str, Callable[[], None]]:
        return {name: self._wrap(name, fn) for name, fn in super()._bind_actions().items()}

    def _runner(self, t: Any) -> Callable[..., None]:
        run = super()._runner(t)

        def interrupted(*a: Any, **k: Any) -> None:
            run(*a, **k)
            target = self.interrupt_in
            if target is not None and target is t.dest:
                self.interrupt_in = None
                raise LoopInterrupt(f"the loop is interrupted in {target.value}")

        return interrupted

    def mark_fired(self) -> None:
        """The fault fires now: set :attr:`fired` and tell ``on_fire``."""
        self.fired.set()
        if self._on_fire is not None:
            self._on_fire()

    def _hit(self, name: str) -> bool:
        f = self.fault
        if f is None or self.fired.is_set() or f.action != name or self.state is not f.dest:
            return False
        trigger, _t, source = self._pending
        if trigger != f.trigger or source is not f.source:
            return False
        self._seen += 1
        return self._seen >= self.occurrence

    def _wrap(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            hit = self._hit(name)
            if hit:
                self.mark_fired()
                kind = self.fault_kind
                if kind is FaultKind.RAISE:
                    raise InjectedFault(f"injected fault before {name}")
                if kind is FaultKind.HANG:
                    self.release.wait(self.hang_limit_s)
                elif kind is FaultKind.DIE:
                    if self._die is not None:
                        self._die()
                    raise RankDied(f"rank {self.rank} died in {name}")
            fn()
            if hit and self.fault_kind is FaultKind.RAISE_AFTER:
                raise InjectedFault(f"injected fault after {name}")

        return run


class AtomicCheckpointTrainer(RecordingTrainer):
    """A recording trainer that writes each checkpoint atomically: a temporary directory renamed into place."""

    def __init__(self, root: Path, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        self._call("save_checkpoint")
        final = self.root / f"ckpt-{step:06d}"
        tmp = self.root / f".tmp-ckpt-{step:06d}"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "meta.json").write_text(json.dumps({"step": step, "weight_version": weight_version}))
        os.replace(tmp, final)
        self.saves.append((step, weight_version, dict(extra_state)))

    def on_disk(self) -> tuple[list[tuple[int, int]], list[str]]:
        """(complete checkpoints as (step, weight version), half-written leftovers)."""
        complete, partial = [], []
        for p in sorted(self.root.iterdir()):
            if p.name.startswith(".tmp"):
                partial.append(p.name)
                continue
            try:
                meta = json.loads((p / "meta.json").read_text())
                complete.append((int(meta["step"]), int(meta["weight_version"])))
            except (OSError, ValueError, KeyError):
                partial.append(p.name)
        return complete, partial


@dataclass
class RankOutcome:
    """How one rank ended."""

    rank: int
    state: State
    error: BaseException | None
    failure: LifecycleError | None
    weight_version: int
    fault_fired: bool
    died: bool
    thread_finished: bool
    engine_condition: str
    collector_running: bool
    machine_engine: str
    machine_collector: str
    trained: int
    batches_trained: int
    batches_kept: int
    batches_produced: int
    saves_completed: list[tuple[int, int]]
    checkpointing_ok: list[int]
    on_disk: list[tuple[int, int]]
    half_written: list[str]
    journal: list[str] = field(default_factory=list)


HEALTHY_BARRIER_TIMEOUT_S = 30.0
"""How long a barrier met before the run's fault fired may wait: every rank is healthy and will come, however
slowly a loaded machine runs 100 rank threads. Only barriers after the fault get the short timeout under test."""


class _HandoffBarrier(threading.Barrier):
    """The ranks' shared barrier, counting its generations (one per release of every rank) and the waits in it with
    a timeout longer than the peers' (``peers_timeout_s``): a wait begun while every rank was healthy. So
    :func:`_break_after_fault` breaks only a barrier such a wait is still held in; never one every rank already left
    (a released rank the scheduler has not run yet included), and never a wait begun after the fault, which times
    out on its own, as a real peer's would."""

    def __init__(self, parties: int, peers_timeout_s: float) -> None:
        super().__init__(parties, action=self._released)
        self.peers_timeout_s, self.generation = peers_timeout_s, 0
        self._lock = threading.Lock()
        self._long_waits: dict[int, int] = {}  # id of a wait with a longer timeout than the peers' -> its generation

    def _released(self) -> None:  # runs under the barrier's own lock, before any rank is woken
        self.generation += 1

    def wait(self, timeout: float | None = None) -> int:
        token = object()
        if timeout is None or timeout > self.peers_timeout_s:
            with self._lock:
                # this rank's arrival is needed for the generation read here to end, so it is the wait's own
                self._long_waits[id(token)] = self.generation
        try:
            return super().wait(timeout)
        finally:
            with self._lock:
                self._long_waits.pop(id(token), None)

    def holds_a_healthy_wait(self) -> bool:
        """Whether a wait begun before the fault (its timeout longer than the peers') is in the generation not yet
        released (a wait whose generation ended is over, even if its rank has not run since)."""
        with self._lock:
            return any(g == self.generation for g in self._long_waits.values())


class _FaultRunBarrier(ThreadBarrier):
    """A :class:`ThreadBarrier` whose timeout is ``healthy_s`` until the run's fault fired, ``timeout_s`` after.

    A barrier entered while every rank was still healthy is broken (as a peer's timeout would) ``timeout_s``
    after the fault fires, by :func:`_break_after_fault`; a barrier entered later times out after ``timeout_s``.
    """

    def __init__(
        self, shared: threading.Barrier, rank: int, *, timeout_s: float, healthy_s: float, fault_fired: threading.Event
    ) -> None:
        super().__init__(shared, rank, timeout_s=timeout_s)
        self.short_s, self.healthy_s, self.fault_fired = timeout_s, max(healthy_s, timeout_s), fault_fired

    def wait(self, *, state: str | None = None, weight_version: int | None = None, fingerprint: Any = None) -> None:
        self.timeout_s = self.short_s if self.fault_fired.is_set() else self.healthy_s
        super().wait(state=state, weight_version=weight_version, fingerprint=fingerprint)


def _break_after_fault(
    shared: _HandoffBarrier,
    fault_fired: threading.Event,
    timeout_s: float,
    threads: list[threading.Thread],
    checked: threading.Event | None = None,
) -> None:
    """Once the fault fired and ``timeout_s`` (the peers' timeout) has passed, break the shared barrier as soon as a
    wait begun while every rank was healthy is held in it: that wait's long timeout is not the one under test, and
    its rank may reach it late (chose its timeout before the fault, then was not scheduled), so the breaker watches
    until every rank has ended. A barrier every rank has left, and a wait begun after the fault, are left alone, so
    a rank still running after the fault meets its next barrier whole or times out on its own. ``checked`` (tests)
    is set after each look at the barrier past the deadline."""
    while any(t.is_alive() for t in threads):
        if fault_fired.wait(0.1):
            deadline = time.monotonic() + timeout_s
            while any(t.is_alive() for t in threads):
                if time.monotonic() >= deadline:
                    if shared.holds_a_healthy_wait():
                        shared.abort()
                        return
                    if checked is not None:
                        checked.set()
                time.sleep(0.05)
            return


def _decision(name: str, steps: Sequence[StepPlan], attr: str) -> LatchedDecision:
    return LatchedDecision(name, lambda step: step < len(steps) and bool(getattr(steps[step], attr)))


def _rank_main(
    scenario: Scenario,
    rank: int,
    world: int,
    shared: threading.Barrier,
    barrier_timeout_s: float,
    root: Path,
    fault: FaultPoint | None,
    kind: FaultKind,
    release: threading.Event,
    abort_on_failure: bool,
    out: dict[int, RankOutcome],
    spec: LifecycleSpec,
    healthy_timeout_s: float = HEALTHY_BARRIER_TIMEOUT_S,
    fault_fired: threading.Event | None = None,
) -> None:
    fault_fired = fault_fired or threading.Event()
    journal = Journal()
    engine = RecordingEngine(journal, urls=[f"http://127.0.0.1:{8000 + rank}/v1"])
    trainer = AtomicCheckpointTrainer(root / f"rank{rank}", journal)
    collector = RecordingCollector(journal)
    lc = FaultyLifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=scenario.num_steps, rank=rank, world_size=world),
        drain=lambda: rank,
        barrier=_FaultRunBarrier(
            shared, rank, timeout_s=barrier_timeout_s, healthy_s=healthy_timeout_s, fault_fired=fault_fired
        ),
        checkpoint=_decision("checkpoint", scenario.steps, "save"),
        validation=_decision("validation", scenario.steps, "validate"),
        spec=spec,
        fault=fault if fault is not None and fault.action is not None else None,
        kind=kind,
        release=release,
        on_fire=fault_fired.set,
        interrupt_in=scenario.stop_in,
    )
    produced = trained_batches = kept = 0
    error: BaseException | None = None
    died = False
    rest_fault = fault if fault is not None and fault.action is None else None

    def resting_fault() -> None:
        if rest_fault is not None and lc.state is rest_fault.dest:
            lc.mark_fired()
            raise RankDied(f"rank {rank} died resting in {lc.state.value}")

    batch: list[int] = []
    try:
        try:
            resting_fault()
            if scenario.start:
                lc.start()
                resting_fault()
                for i, _plan in enumerate(scenario.steps):
                    if lc.finished:
                        break
                    if scenario.fail_first and i == 0:
                        collector.fail_on("pause")
                    batch = [i * 10 + k for k in range(3)]
                    produced += len(batch)
                    before = trainer.steps
                    try:
                        lc.step(batch)
                    finally:
                        if trainer.steps > before:
                            trained_batches += len(batch)
                        else:
                            kept += len(batch)  # never trained on: still the caller's, not lost
                    batch = []
                    resting_fault()
                    if lc.state is S.VALIDATING and scenario.end_validation:
                        lc.end_validation()
                        resting_fault()
            lc.stop()
        except LoopInterrupt:
            lc.stop(unused=batch)  # the loop stops the run from where it was interrupted
        except LifecycleError:
            if scenario.fail_first and not lc.fired.is_set() and lc.state is S.FAILED:
                lc.stop()  # stop from Failed: the teardown-after-failure path
            else:
                raise
    except RankDied:
        died = True
    except BaseException as exc:
        error = exc
        if abort_on_failure:
            shared.abort()  # the failing rank's process group goes away: peers notice at their next barrier
    finally:
        lc.close()
    if error is None and lc.state is S.FAILED and lc.failure is not None and not died:
        error = lc.failure
    complete, partial = trainer.on_disk()
    out[rank] = RankOutcome(
        rank=rank,
        state=lc.state,
        error=error,
        failure=lc.failure,
        weight_version=lc.weight_version,
        fault_fired=lc.fired.is_set(),
        died=died,
        thread_finished=True,
        engine_condition=engine.condition,
        collector_running=collector.running,
        machine_engine=lc.engine_condition.value,
        machine_collector=lc.collector_condition.value,
        trained=trainer.steps,
        batches_trained=trained_batches,
        batches_kept=kept,
        batches_produced=produced,
        saves_completed=[(s, w) for s, w, _ in trainer.saves],
        checkpointing_ok=[r.weight_version for r in lc.trace.records if r.dest == S.CHECKPOINTING.value and r.ok],
        on_disk=complete,
        half_written=partial,
        journal=journal.methods(),
    )


@dataclass
class FaultRun:
    """One injected fault and how every rank ended."""

    scenario: Scenario
    fault: FaultPoint | None
    kind: FaultKind
    victim: int
    outcomes: dict[int, RankOutcome]
    barrier_after: bool  # the faulty rank's program still had a barrier at/after the fault point
    seconds: float


def run_ranks(
    scenario: Scenario,
    *,
    fault: FaultPoint | None = None,
    kind: FaultKind = FaultKind.RAISE,
    world: int = 2,
    victim: int = 1,
    barrier_timeout_s: float = 10.0,
    root: Path,
    spec: LifecycleSpec = LIFECYCLE,
    join_timeout_s: float = 60.0,
    healthy_timeout_s: float = HEALTHY_BARRIER_TIMEOUT_S,
) -> FaultRun:
    """Run ``scenario`` on ``world`` thread ranks; rank ``victim`` gets the fault. Blocks until all ranks end."""
    handle = start_ranks(
        scenario,
        fault=fault,
        kind=kind,
        world=world,
        victim=victim,
        barrier_timeout_s=barrier_timeout_s,
        root=root,
        spec=spec,
        healthy_timeout_s=healthy_timeout_s,
    )
    return handle.join(join_timeout_s)


class RankRun:
    """A started :func:`run_ranks` (many can run at once, so their timeouts overlap)."""

    def __init__(
        self,
        scenario: Scenario,
        fault: FaultPoint | None,
        kind: FaultKind,
        world: int,
        victim: int,
        threads: list[threading.Thread],
        out: dict[int, RankOutcome],
        release: threading.Event,
        barrier_after: bool,
    ) -> None:
        self.scenario, self.fault, self.kind, self.world, self.victim = scenario, fault, kind, world, victim
        self.threads, self.out, self.release, self.barrier_after = threads, out, release, barrier_after
        self.t0 = time.perf_counter()

    def join(self, timeout_s: float = 60.0) -> FaultRun:
        deadline = time.monotonic() + timeout_s
        peers = [t for r, t in enumerate(self.threads) if r != self.victim]
        for t in peers:
            t.join(max(0.0, deadline - time.monotonic()))
        self.release.set()  # a hung rank resumes once every peer has ended
        self.threads[self.victim].join(max(0.0, deadline - time.monotonic()))
        for r, t in enumerate(self.threads):
            if t.is_alive() and r not in self.out:
                self.out[r] = RankOutcome(
                    r, S.CREATED, None, None, -1, False, False, False, "?", False, "?", "?", 0, 0, 0, 0, [], [], [], []
                )
                self.out[r].thread_finished = False
        return FaultRun(
            self.scenario,
            self.fault,
            self.kind,
            self.victim,
            dict(self.out),
            self.barrier_after,
            time.perf_counter() - self.t0,
        )


def start_ranks(
    scenario: Scenario,
    *,
    fault: FaultPoint | None = None,
    kind: FaultKind = FaultKind.RAISE,
    world: int = 2,
    victim: int = 1,
    barrier_timeout_s: float = 10.0,
    root: Path,
    spec: LifecycleSpec = LIFECYCLE,
    healthy_timeout_s: float = HEALTHY_BARRIER_TIMEOUT_S,
) -> RankRun:
    """Start the rank threads of :func:`run_ranks` and return at once.

    ``barrier_timeout_s`` is the peers' timeout once the fault fired (counted from the fault); a barrier met
    while every rank is healthy waits up to ``healthy_timeout_s``, so a loaded machine cannot fail it spuriously.
    """
    fault_fired = threading.Event()
    shared = _HandoffBarrier(world, peers_timeout_s=barrier_timeout_s)
    release = threading.Event()
    out: dict[int, RankOutcome] = {}
    abort = False  # a failed rank simply stops taking part, as a real process group member would
    threads = [
        threading.Thread(
            target=_rank_main,
            name=f"fault-rank{r}",
            daemon=True,
            args=(
                scenario,
                r,
                world,
                shared,
                barrier_timeout_s,
                Path(root),
                fault if r == victim else None,
                kind,
                release,
                abort,
                out,
                spec,
                healthy_timeout_s,
                fault_fired,
            ),
        )
        for r in range(world)
    ]
    for t in threads:
        t.start()
    threading.Thread(
        target=_break_after_fault,
        name="fault-barrier-breaker",
        daemon=True,
        args=(shared, fault_fired, barrier_timeout_s, threads),
    ).start()
    return RankRun(
        scenario,
        fault,
        kind,
        world,
        victim,
        threads,
        out,
        release,
        barrier_after=_barrier_after(spec, scenario, fault, kind),
    )


# ---------------------------------------------------------------------------------------------- enumeration
def program_of(scenario: Scenario, spec: LifecycleSpec = LIFECYCLE) -> list[FaultPoint]:
    """The (transition, action) sequence one rank runs for ``scenario`` when nothing goes wrong."""
    return _points_from_run(scenario, spec)


def _points_from_run(scenario: Scenario, spec: LifecycleSpec) -> list[FaultPoint]:
    import tempfile

    records: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal()
        engine, trainer, collector = (
            RecordingEngine(journal),
            AtomicCheckpointTrainer(Path(tmp), journal),
            RecordingCollector(journal),
        )
        lc = FaultyLifecycle(
            engine,
            trainer,
            collector,
            config=LifecycleConfig(num_steps=scenario.num_steps),
            drain=lambda: 0,
            checkpoint=_decision("c", scenario.steps, "save"),
            validation=_decision("v", scenario.steps, "validate"),
            spec=spec,
            interrupt_in=scenario.stop_in,
        )
        try:
            try:
                if scenario.start:
                    lc.start()
                    for i, _plan in enumerate(scenario.steps):
                        if lc.finished:
                            break
                        if scenario.fail_first and i == 0:
                            collector.fail_on("pause")
                        try:
                            lc.step([i])
                        except LifecycleError:
                            break
                        if lc.state is S.VALIDATING and scenario.end_validation:
                            lc.end_validation()
                lc.stop()
            except LoopInterrupt:
                lc.stop()
        finally:
            records = lc.trace.records
            lc.close()
    by_edge = {(t.trigger, t.source.value, t.dest.value): t for t in spec.transitions}
    points: list[FaultPoint] = []
    for r in records:
        t = by_edge.get((r.trigger, r.source, r.dest))
        if t is None:
            continue
        points.extend(FaultPoint(t.trigger, t.source, t.dest, a) for a in t.actions)
    return points


def fault_points(
    spec: LifecycleSpec = LIFECYCLE, scenarios: Iterable[Scenario] = SCENARIOS
) -> dict[FaultPoint, Scenario]:
    """Every (transition, action) the scenarios run, each mapped to the first scenario that runs it."""
    found: dict[FaultPoint, Scenario] = {}
    for sc in scenarios:
        for p in _points_from_run(sc, spec):
            found.setdefault(p, sc)
    return found


def rest_points(
    spec: LifecycleSpec = LIFECYCLE, scenarios: Iterable[Scenario] = SCENARIOS
) -> dict[FaultPoint, Scenario]:
    """Every resting state a rank can die in, with a scenario that rests there."""
    found: dict[FaultPoint, Scenario] = {}
    for sc in scenarios:
        if sc.fail_first:
            continue
        states = [spec.initial] + [p.dest for p in _points_from_run(sc, spec)]
        for st in states:
            if spec.state(st).resting and not spec.state(st).terminal:
                found.setdefault(FaultPoint("", st, st, None), sc)
    return found


def uncovered(spec: LifecycleSpec = LIFECYCLE, scenarios: Iterable[Scenario] = SCENARIOS) -> list[FaultPoint]:
    """Declared (transition, action) pairs no scenario runs (should be empty)."""
    have = set(fault_points(spec, scenarios))
    return [
        FaultPoint(t.trigger, t.source, t.dest, a)
        for t in spec.transitions
        for a in t.actions
        if FaultPoint(t.trigger, t.source, t.dest, a) not in have
    ]


def _barrier_after(spec: LifecycleSpec, scenario: Scenario, fault: FaultPoint | None, kind: FaultKind) -> bool:
    if fault is None:
        return False
    prog = _points_from_run(scenario, spec)
    if fault.action is None:  # resting: the next transition onwards
        idx = next((i for i, p in enumerate(prog) if p.source is fault.dest), len(prog))
        if fault.dest is spec.initial:
            idx = 0
    else:
        idx = prog.index(fault)
        if kind is FaultKind.RAISE_AFTER:
            idx += 1
    return any(p.action is not None and spec.action(p.action).role is Role.BARRIER for p in prog[idx:])


# ---------------------------------------------------------------------------------------------- judging
def _role(action: str, spec: LifecycleSpec = LIFECYCLE) -> Role | None:
    """The declared role of ``action`` (in ``spec``, else in any preset that declares it)."""
    from colo_fsm.states.presets import PRESETS

    for sp in (spec, *PRESETS.values()):
        if action in {a.name for a in sp.actions}:
            return sp.action(action).role
    return None


def check_outcome(run: FaultRun) -> list[str]:
    """Everything wrong with how the ranks ended (empty when the lifecycle handled the fault as documented)."""
    problems: list[str] = []
    where = f"{run.scenario.name} / {run.kind.value} at {run.fault.label() if run.fault else 'nowhere'}"
    for r, o in sorted(run.outcomes.items()):
        who = f"{where}: rank {r}"
        if not o.thread_finished:
            problems.append(f"{who}: still running (hung) after the join timeout")
            continue
        if o.died:
            continue  # a dead rank says nothing; its peers must notice
        if o.state is S.FAILED:
            f = o.failure
            if f is None or o.error is not f:
                problems.append(f"{who}: Failed, but the caller got {o.error!r} and the machine recorded {f!r}")
            elif f.state is None or f.rank != r or f.weight_version != o.weight_version:
                problems.append(
                    f"{who}: the error must name state, rank {r} and weight version {o.weight_version}: {f}"
                )
            else:
                text = str(f)
                for part in (f"state={f.state}", f"rank={r}", f"weight_version={o.weight_version}"):
                    if part not in text:
                        problems.append(f"{who}: {part!r} missing from {text!r}")
            if o.engine_condition == "awake" and o.machine_engine != "unknown":
                problems.append(f"{who}: Failed with the engine awake (documented: suspended)")
            if o.collector_running and o.machine_collector != "unknown":
                problems.append(f"{who}: Failed with the collector running (documented: paused)")
        elif o.state is not S.STOPPED:
            problems.append(f"{who}: ended in {o.state.value}, neither Stopped nor Failed (error {o.error!r})")
        # nothing lost, nothing half-written
        if o.half_written:
            problems.append(f"{who}: half-written checkpoints {o.half_written}")
        started = sum(1 for call in o.journal if call == "trainer.save_checkpoint")
        if started != len(o.saves_completed):  # the journal: no save started and abandoned half-way
            problems.append(f"{who}: {started} save(s) started, {len(o.saves_completed)} completed")
        if sorted(o.on_disk) != sorted(o.saves_completed):
            problems.append(f"{who}: saves reported {o.saves_completed}, on disk {o.on_disk}")
        for wv in o.checkpointing_ok:
            if wv not in [w for _s, w in o.on_disk]:
                problems.append(f"{who}: the machine completed a save at weight version {wv} that is not on disk")
        if o.batches_trained + o.batches_kept != o.batches_produced:
            problems.append(
                f"{who}: trajectories lost: produced {o.batches_produced}, trained "
                f"{o.batches_trained}, kept {o.batches_kept}"
            )
        between = (
            run.fault is not None
            and r == run.victim
            and o.state is S.FAILED
            and run.fault.action is not None
            and (_role(run.fault.action), run.kind)
            in ((Role.BUMP, FaultKind.RAISE), (Role.TRAIN, FaultKind.RAISE_AFTER))
        )
        # a failure between the optimizer step and the bump leaves the version one behind (the run is Failed)
        if o.weight_version != o.trained and not (between and o.weight_version == o.trained - 1):
            problems.append(f"{who}: weight version {o.weight_version} after {o.trained} training steps")
    if run.fault is None:
        return problems
    victim = run.outcomes.get(run.victim)
    peers = [o for r, o in run.outcomes.items() if r != run.victim]
    if victim is None or not victim.fault_fired:
        problems.append(f"{where}: the fault never fired on rank {run.victim}")
        return problems
    kind = run.kind
    if kind in (FaultKind.RAISE, FaultKind.RAISE_AFTER):
        if victim.state is not S.FAILED or not isinstance(victim.failure, ActionFailed):
            problems.append(
                f"{where}: rank {run.victim} ended in {victim.state.value} with {victim.error!r}, "
                "expected Failed with ActionFailed"
            )
        elif victim.failure.action != run.fault.action or victim.failure.state != run.fault.dest.value:
            problems.append(
                f"{where}: the error names action {victim.failure.action!r} in "
                f"{victim.failure.state}, expected {run.fault.action!r} in {run.fault.dest.value}"
            )
    elif kind is FaultKind.HANG:
        want = S.FAILED if run.barrier_after else S.STOPPED
        if victim.state is not want:
            problems.append(f"{where}: hung rank {run.victim} ended in {victim.state.value}, expected {want.value}")
    for o in peers:
        if not o.thread_finished or o.died:
            continue
        if run.barrier_after:
            cause = getattr(o.failure, "cause", None)
            if o.state is not S.FAILED or not isinstance(cause, BarrierTimeout):
                problems.append(
                    f"{where}: peer rank {o.rank} ended in {o.state.value} ({o.error!r}); expected "
                    "Failed at its next barrier with a BarrierTimeout"
                )
            elif cause.rank != o.rank or cause.state is None:
                problems.append(
                    f"{where}: peer rank {o.rank}'s barrier timeout names rank {cause.rank}, state {cause.state}"
                )
        elif o.state is not S.STOPPED:
            problems.append(
                f"{where}: peer rank {o.rank} ended in {o.state.value} ({o.error!r}); no barrier "
                "was left, so it should have finished"
            )
    return problems


def run_all(
    kind: FaultKind,
    *,
    root: Path,
    world: int = 2,
    barrier_timeout_s: float | None = None,
    spec: LifecycleSpec = LIFECYCLE,
    resting: bool = False,
    healthy_timeout_s: float = HEALTHY_BARRIER_TIMEOUT_S,
) -> list[FaultRun]:
    """Inject ``kind`` at every fault point (or, with ``resting``, in every resting state), all runs at once.

    The 1.5 s default timeout applies only to barriers after the fault fired; healthy ones wait
    ``healthy_timeout_s`` (so 100 rank threads on a loaded CI machine do not fail a healthy barrier)."""
    timeout = barrier_timeout_s if barrier_timeout_s is not None else 1.5
    points = rest_points(spec) if resting else fault_points(spec)
    handles = [
        start_ranks(
            sc,
            fault=p,
            kind=kind,
            world=world,
            barrier_timeout_s=timeout,
            root=Path(root) / f"{kind.value}-{i}",
            spec=spec,
            healthy_timeout_s=healthy_timeout_s,
        )
        for i, (p, sc) in enumerate(points.items())
    ]
    return [h.join(60.0) for h in handles]


# ---------------------------------------------------------------------------------------------- real gloo
def gloo_fault_worker(
    rank: int, world: int, port: int, mode: str, timeout_s: float, out: Any, startup_delay_s: float = 0.0
) -> None:
    """One rank of a real two-process gloo run (``mode``: ``die`` or ``never_arrives`` for rank 1).

    Rank 1 dies (``os._exit``) or sleeps past the timeout at the barrier of the handoff to training; rank 0's
    :class:`~colo_fsm.guards.barrier.TorchBarrier` must time out and its lifecycle end in Failed naming state,
    rank and weight version (1: the fault hits the second step). Puts ``(mode, rank, result dict)`` on ``out``.
    ``startup_delay_s`` (every rank) stands for a loaded machine being slow before the run starts: the hang
    still lasts twice the timeout from when it begins.
    """
    from datetime import timedelta

    import torch.distributed as dist

    from colo_fsm.guards.barrier import TorchBarrier

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    journal = Journal()
    engine, trainer, collector = RecordingEngine(journal), RecordingTrainer(journal), RecordingCollector(journal)
    point = FaultPoint("begin_step", S.GENERATING, S.DRAINING, "barrier")

    def die() -> None:
        out.put((mode, rank, {"died": True}))
        out.close()
        out.join_thread()  # flush the queue before the process vanishes
        os._exit(17)

    kind = FaultKind.DIE if mode == "die" else FaultKind.HANG
    release = threading.Event()  # never set: the hang lasts hang_limit_s, counted from when it begins (not from
    # here, before the start and the first step, which a loaded machine can slow past the peer's timeout)
    lc = FaultyLifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=4, rank=rank, world_size=world),
        drain=lambda: rank,
        barrier=TorchBarrier(timeout_s=timeout_s),
        checkpoint=LatchedDecision("c", lambda s: False),
        validation=LatchedDecision("v", lambda s: False),
        fault=point if rank == 1 else None,
        kind=kind,
        release=release,
        hang_limit_s=timeout_s * 2,
        die=die,
        occurrence=2,
    )
    time.sleep(startup_delay_s)
    t0 = time.monotonic()
    result: dict[str, Any] = {}
    try:
        lc.start()
        lc.step([1, 2])
        lc.step([3])
        result["error"] = None
    except LifecycleError as exc:
        result["error"] = str(exc)
        result["cause"] = type(getattr(exc, "cause", None)).__name__
    result.update(
        state=lc.state.value,
        waited_s=time.monotonic() - t0,
        weight_version=lc.weight_version,
        failure_state=getattr(lc.failure, "state", None),
        failure_rank=getattr(lc.failure, "rank", None),
        failure_wv=getattr(lc.failure, "weight_version", None),
        engine=engine.condition,
        collector_running=collector.running,
    )
    out.put((mode, rank, result))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


__all__ = [
    "SCENARIOS",
    "AtomicCheckpointTrainer",
    "FaultKind",
    "FaultPoint",
    "FaultRun",
    "FaultyLifecycle",
    "RankDied",
    "RankOutcome",
    "RankRun",
    "Scenario",
    "check_outcome",
    "fault_points",
    "gloo_fault_worker",
    "program_of",
    "rest_points",
    "run_all",
    "run_ranks",
    "start_ranks",
    "uncovered",
]
