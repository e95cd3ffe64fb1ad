"""Property-based lifecycle tests: a ``hypothesis.stateful`` machine that drives a :class:`Lifecycle`.

:class:`LifecycleMachine` runs arbitrary interleavings of the events an async RL loop sees (steps ready,
validation due, a checkpoint due by period or by a "must save by" deadline on a fake clock, requests arriving at
the server, rollouts admitted and finished, a fault in any adapter call, triggers fired from the wrong state,
stop) against *your* adapters, and checks the lifecycle rules (:class:`~colo_fsm.states.rules.LifecycleRule`)
with an ``@invariant`` each after every step; an invariant names the rule it checks
(:func:`~colo_fsm.states.rules.rule_of`) and its failure starts with the rule. It reads the adapters only
through recording proxies (:mod:`colo_fsm.testing.watch`), so the checks are independent of the machine's own
bookkeeping.

Use it with your adapters::

    from colo_fsm.testing import lifecycle_test_case

    def make_adapters():
        return MyEngine(), MyTrainer(), MyCollector()      # or an Adapters(...) with probes

    TestMyAdapters = lifecycle_test_case(make_adapters)  # a unittest.TestCase pytest collects

Adapters may be ``async def``: coroutines are run on an event loop the machine owns.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from colo_fsm.errors import GuardRejected, InvalidTransition, LifecycleError
from colo_fsm.guards.barrier import SoloBarrier
from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.guards.drain import DeviceDrain
from colo_fsm.machine.aio import AsyncLifecycle
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.rules import LifecycleRule, checks
from colo_fsm.states.spec import LIFECYCLE, CollectorCondition, EngineCondition, Fact, LifecycleSpec, State
from colo_fsm.testing.fakes import (
    FakeClock,
    FakeReplayBuffer,
    FakeRequestSource,
    Journal,
    RecordingCollector,
    RecordingEngine,
    RecordingTrainer,
)
from colo_fsm.testing.profiles import lifecycle_settings
from colo_fsm.testing.watch import (
    ADAPTER_CALLS,
    FAULT_TARGETS,
    Conditions,
    EventLog,
    FaultSwitch,
    HandoffAudit,
    InjectedFault,
    LoopRunner,
    WatchedBarrier,
    WatchedCollector,
    WatchedEngine,
    WatchedTrainer,
    watched_synchronize,
)

E, C, S = EngineCondition, CollectorCondition, State

STATS: collections.Counter[str] = collections.Counter()
"""Counts over every lifecycle machine run in this process: programs, steps, faults fired, ... (for reports)."""
_STATS_LOCK = threading.Lock()


def _count(key: str, n: int = 1) -> None:
    with _STATS_LOCK:
        STATS[key] += n


# ---------------------------------------------------------------------------------------------- adapters
@dataclass
class Adapters:
    """What an adapter factory returns: the three adapters, plus optional probes of their real conditions.

    ``engine_probe`` returns the engine's own idea of its condition (``"awake"``, ``"suspended"``, ...,
    or an :class:`EngineCondition`), ``collector_probe`` ``"running"``/``"paused"``. Without probes the machine
    checks the conditions its proxies track from the calls that returned. ``close`` runs after each program.
    """

    engine: Any
    trainer: Any
    collector: Any | None = None
    engine_probe: Callable[[], Any] | None = None
    collector_probe: Callable[[], Any] | None = None
    close: Callable[[], None] | None = None


AdapterFactory = Callable[[], Any]
"""A zero-argument callable returning :class:`Adapters` or an ``(engine, trainer, collector)`` tuple."""


def recording_fakes() -> Adapters:
    """The recording fakes of :mod:`colo_fsm.testing.fakes`, with probes reading their own conditions."""
    j = Journal()
    engine = RecordingEngine(j, urls=["http://127.0.0.1:8000/v1"])
    collector = RecordingCollector(j)
    return Adapters(engine, RecordingTrainer(j), collector)


def as_adapters(obj: Any) -> Adapters:
    """Normalize a factory's result; derive probes from a ``condition`` / ``running`` attribute when present."""
    ad = obj if isinstance(obj, Adapters) else Adapters(*obj)
    if ad.engine_probe is None and isinstance(getattr(ad.engine, "condition", None), str | EngineCondition):
        engine = ad.engine
        ad.engine_probe = lambda: engine.condition
    if (
        ad.collector is not None
        and ad.collector_probe is None
        and isinstance(getattr(ad.collector, "running", None), bool)
    ):
        collector = ad.collector
        ad.collector_probe = lambda: "running" if collector.running else "paused"
    return ad


# ---------------------------------------------------------------------------------------------- fault targets
_ACTION_TARGETS: dict[str, tuple[str, str]] = {action: target for target, action in ADAPTER_CALLS.items()}
_VALIDATOR_TARGET = ("validator", "validate")
_CALLABLE: dict[tuple[int, State, bool], tuple[tuple[str, str], ...]] = {}

_RARE_TARGETS: tuple[tuple[str, str], ...] = (
    ("trainer", "train_step"),
    ("trainer", "save_checkpoint"),
    ("barrier", "wait"),
    ("engine", "resume"),
    _VALIDATOR_TARGET,
)
_FAULT_DRAWS: tuple[tuple[str, str], ...] = (*FAULT_TARGETS, *_RARE_TARGETS, *_RARE_TARGETS)
"""What the ``fault`` event draws from: every target, the ones only some steps call (a save, a validation) or
only once per step weighted up, so each fires in the CI profile's 500 programs."""

_FIRST_FAULTS: tuple[tuple[str, str] | None, ...] = (
    *(None,) * 12,
    *(t for t in _FAULT_DRAWS if t[1] not in ("bring_up", "server_base_urls")),
    *(_VALIDATOR_TARGET,) * 4,
)
"""The fault armed before a program starts (about a third have none). It waits for its call from the first step
on, so the rare calls of a step (a save, an inline validation, weighted up most) fail in 500 programs; the start's
own calls are left out (a failed start ends a program before any step), they fail from ``disturb`` before it."""

FAULT_PATIENCE = 12
"""Lifecycle calls an armed fault may wait for its target before it is disarmed (so it cannot block the others)."""


def callable_targets(spec: LifecycleSpec, state: State, *, inline_validator: bool) -> tuple[tuple[str, str], ...]:
    """The :data:`FAULT_TARGETS` a lifecycle resting in ``state`` may still call, read from ``spec``.

    Every state reachable from ``state`` (guards ignored, the fail edge excluded) contributes the adapter calls of
    the actions its outgoing transitions run; the inline validator counts once Validating is reachable. A target
    outside this set (``engine.bring_up`` after the build, anything but teardown after a failure) can never fire.
    """
    key = (id(spec), state, inline_validator)
    hit = _CALLABLE.get(key)
    if hit is not None:
        return hit
    seen, todo, actions = {state}, [state], set[str]()
    while todo:
        here = todo.pop()
        for t in spec.outgoing(here):
            actions.update(t.actions)
            if t.dest not in seen:
                seen.add(t.dest)
                todo.append(t.dest)
    found = {_ACTION_TARGETS[a] for a in actions if a in _ACTION_TARGETS}
    if inline_validator and State.VALIDATING in seen:
        found.add(_VALIDATOR_TARGET)
    result = tuple(t for t in FAULT_TARGETS if t in found)
    _CALLABLE[key] = result
    return result


# ---------------------------------------------------------------------------------------------- programs
@dataclass(frozen=True)
class RunConfig:
    """One drawn run configuration (decisions, resume point, collector sizing)."""

    num_steps: int | None
    start_step: int
    start_weight_version: int
    checkpoint_every: int | None
    must_save_by_s: float | None
    validate_every: int | None
    inline_validator: bool
    max_trajectory_age_steps: int
    num_prompts_per_step: int
    samples_per_group: int
    actor_max_concurrency: int
    control_headroom: int


@st.composite
def run_configs(draw: st.DrawFn) -> RunConfig:
    """Strategy for :class:`RunConfig`."""
    num_steps = draw(st.one_of(st.none(), st.integers(1, 6)))
    start_step = draw(st.integers(0, (num_steps - 1) if num_steps else 3)) if draw(st.booleans()) else 0
    amc = draw(st.sampled_from([16, 64, 256, 1000]))
    spg = draw(st.integers(1, 16))
    return RunConfig(
        num_steps=num_steps,
        start_step=start_step,
        start_weight_version=draw(st.integers(0, 3)),
        checkpoint_every=draw(st.one_of(st.none(), st.integers(1, 3))),
        must_save_by_s=draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 5.0, 20.0]))),
        validate_every=draw(st.one_of(st.none(), st.integers(1, 3))),
        inline_validator=draw(st.booleans()),
        max_trajectory_age_steps=draw(st.integers(1, 3)),
        num_prompts_per_step=draw(st.integers(1, 128)),
        samples_per_group=spg,
        actor_max_concurrency=amc,
        control_headroom=draw(st.integers(0, min(8, amc - spg))),
    )


@dataclass
class StepRecord:
    """What the machine expects of one step, decided by an oracle at the moment the step latched."""

    step: int
    save: bool
    validate: bool
    last: bool
    event_index: int
    wv_before: int
    done: bool = False


def _cond(value: Any) -> str | None:
    if value is None:
        return None
    return str(value.value if hasattr(value, "value") else value)


# ---------------------------------------------------------------------------------------------- machine
class LifecycleMachine(RuleBasedStateMachine):
    """Drives one :class:`Lifecycle` over your adapters and checks the lifecycle rules after every step.

    Configure by subclassing (or through :func:`lifecycle_test_case`):

    * ``adapters_factory``: zero-argument callable returning :class:`Adapters` or a triple (default: fakes);
    * ``spec`` / ``check_spec``: the lifecycle to run (a mutated one with ``check_spec=False`` in mutation tests);
    * ``lifecycle_class``, ``drain_class``, ``checkpoint_class``, ``cap_class``: components (mutants swap them);
    * ``local_rank``: the device the drain must synchronize (non-zero, so a drain of device 0 shows);
    * ``inject_faults``: whether rules may make adapter calls fail;
    * ``use_async_lifecycle``: drive an :class:`AsyncLifecycle` on the machine's own event loop;
    * ``async_training``: passed to :class:`LifecycleConfig` (False for engines that refit weights).
    """

    adapters_factory: ClassVar[AdapterFactory] = recording_fakes
    spec: ClassVar[LifecycleSpec] = LIFECYCLE
    check_spec: ClassVar[bool] = True
    lifecycle_class: ClassVar[type[Lifecycle]] = Lifecycle
    drain_class: ClassVar[Callable[..., Callable[[], object]]] = DeviceDrain
    checkpoint_class: ClassVar[Callable[..., LatchedDecision]] = CheckpointDecision
    cap_class: ClassVar[Callable[..., InFlightCap]] = InFlightCap
    local_rank: ClassVar[int] = 3
    inject_faults: ClassVar[bool] = True
    use_async_lifecycle: ClassVar[bool] = False
    async_training: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.runner = LoopRunner()
        self.lc: Lifecycle | None = None
        self.alc: AsyncLifecycle | None = None
        self.ad: Adapters | None = None
        self.violations: dict[str, list[str]] = collections.defaultdict(list)
        _count("programs")

    # ------------------------------------------------------------------ setup / teardown
    @initialize(cfg=run_configs(), autostart=st.integers(0, 4), first_fault=st.sampled_from(_FIRST_FAULTS))
    def setup(self, cfg: RunConfig, autostart: int, first_fault: tuple[str, str] | None = None) -> None:
        """Build adapters, proxies and the lifecycle for one drawn configuration; usually start it, too.

        ``first_fault`` (see :data:`_FIRST_FAULTS`) is armed before anything runs and waits for its call.
        """
        cls = type(self)
        self.cfg = cfg
        self.ad = as_adapters(cls.adapters_factory())
        self.conditions = Conditions()
        self.log = EventLog(self._state_name, self.conditions, self._probe)
        self.faults = FaultSwitch()
        self.engine = WatchedEngine(self.ad.engine, self.log, self.faults, self.runner)
        self.trainer = WatchedTrainer(self.ad.trainer, self.log, self.faults, self.runner)
        self.collector = (
            WatchedCollector(self.ad.collector, self.log, self.faults, self.runner)
            if self.ad.collector is not None
            else None
        )
        self.clock = FakeClock()
        self.deadline_at = None if cfg.must_save_by_s is None else self.clock() + cfg.must_save_by_s
        self.deadline_fired = False
        drain = cls.drain_class(cls.local_rank, synchronize=watched_synchronize(self.log, self.faults))
        self.lc = cls.lifecycle_class(
            self.engine,
            self.trainer,
            self.collector,
            config=LifecycleConfig(
                num_steps=cfg.num_steps,
                start_step=cfg.start_step,
                start_weight_version=cfg.start_weight_version,
                async_training=cls.async_training,
            ),
            drain=drain,
            barrier=WatchedBarrier(SoloBarrier(), self.log, self.faults),
            checkpoint=cls.checkpoint_class(cfg.checkpoint_every, must_save_by_s=cfg.must_save_by_s, clock=self.clock),
            validation=ValidationDecision(cfg.validate_every),
            validator=self._validator if cfg.inline_validator else None,
            spec=cls.spec,
            check_spec=cls.check_spec,
        )
        if cls.use_async_lifecycle:
            self.alc = AsyncLifecycle(self.lc)
        self.server = FakeRequestSource(lambda: self.conditions.engine is E.AWAKE, self._state_name)
        self.buffer = FakeReplayBuffer(cfg.max_trajectory_age_steps)
        self.cap = cls.cap_class(
            cfg.num_prompts_per_step,
            cfg.max_trajectory_age_steps,
            cfg.samples_per_group,
            cfg.actor_max_concurrency,
            cfg.control_headroom,
        )
        self.in_flight: list[int] = []  # weight versions of admitted rollout groups
        self.audit = HandoffAudit(cls.spec, cls.local_rank)
        self.steps: list[StepRecord] = []
        self.scan_pos = 0
        self.trace_pos = 0
        self.builds = 0
        self.last_latched_at: int | None = None
        self.validations = 0
        self.fault_waited = 0
        if first_fault is not None and cls.inject_faults:
            self._arm(first_fault)
        if autostart:  # most programs start at once; the others may see faults and triggers before the build
            self.start()

    def teardown(self) -> None:
        if self.lc is not None:
            records = self.lc.trace.records
            _count("transitions", len(records))
            for dest in {r.dest for r in records}:
                _count(f"reached:{dest}")
            for component, method in self.faults.fired:
                _count(f"fired:{component}.{method}")
        try:
            if self.alc is not None:
                self.alc._executor.shutdown(wait=True)
            if self.lc is not None:
                self.lc.close()
            if self.ad is not None and self.ad.close is not None:
                self.ad.close()
        finally:
            self.runner.close()

    # ------------------------------------------------------------------ helpers
    def _state_name(self) -> str:
        return self.lc.state.value if self.lc is not None else self.spec.initial.value

    def _probe(self) -> tuple[str | None, str | None]:
        ad = self.ad
        if ad is None:
            return None, None
        return (
            _cond(ad.engine_probe()) if ad.engine_probe else None,
            _cond(ad.collector_probe()) if ad.collector_probe else None,
        )

    def _at(self, *states: State) -> bool:
        return self.lc is not None and self.lc.state in states

    def _callable_targets(self) -> tuple[tuple[str, str], ...]:
        assert self.lc is not None
        cfg = self.cfg
        targets = callable_targets(self.lc.spec, self.lc.state, inline_validator=cfg.inline_validator)
        never = set()  # calls the rest of this run never makes: its decisions save or validate at no step left
        first = self.lc.step_index
        ahead = range(first, cfg.num_steps if cfg.num_steps is not None else first + 60)
        if cfg.must_save_by_s is None and not (
            cfg.checkpoint_every and any((s + 1) % cfg.checkpoint_every == 0 for s in ahead)
        ):
            never.add(("trainer", "save_checkpoint"))
        not_last = ahead[:-1] if cfg.num_steps is not None else ahead  # the last step never validates
        if not (cfg.validate_every and any((s + 1) % cfg.validate_every == 0 for s in not_last)):
            never.add(_VALIDATOR_TARGET)
        return tuple(t for t in targets if t not in never)

    def _arm(self, drawn: tuple[str, str]) -> None:
        """Arm ``drawn``, or (when no call of it can come any more) a target that can still be called."""
        targets = self._callable_targets()
        if not targets:
            return
        # only a call that can still happen: one that never comes would block every other fault. A drawn target
        # that cannot stands for one that can (a fixed map, so programs still shrink).
        target = drawn if drawn in targets else targets[FAULT_TARGETS.index(drawn) % len(targets)]
        self.faults.arm(*target)
        self.fault_waited = 0
        _count("faults_armed")
        _count(f"armed:{target[0]}.{target[1]}")

    def _retire_fault(self) -> None:
        """After a lifecycle call: disarm a fault that did not fire and no longer can (or waited long enough)."""
        armed = self.faults.armed
        if armed is None:
            return
        self.fault_waited += 1
        if self.fault_waited >= FAULT_PATIENCE or armed not in self._callable_targets():
            self.faults.armed = None
            _count("faults_disarmed")

    def _validator(self, step: int, weight_version: int) -> dict[str, float]:
        self.log.add("validator", "validate", "call", (step, weight_version))
        self.faults.check("validator", "validate")
        self.validations += 1
        return {"accuracy": 1.0}

    def _drive(self, label: str, fn: Callable[..., Any], *args: Any, coro: Any = None) -> bool:
        """Run one lifecycle call; a failure is fine only if an injected fault fired during it."""
        assert self.lc is not None
        fired = len(self.faults.fired)
        _count("lifecycle_calls")
        try:
            if coro is not None:
                self.runner(coro)
            else:
                fn(*args)
        except LifecycleError as exc:
            if len(self.faults.fired) == fired:
                raise AssertionError(
                    f"{label}: the lifecycle failed with no fault injected: {exc}\n  recent calls:\n"
                    + "\n".join(self.log.lines(max(0, len(self.log) - 25)))
                ) from exc
            self._check_failure(label, exc)
            return False
        except InjectedFault as exc:  # escaped the lifecycle untyped
            raise AssertionError(f"{label}: an adapter fault escaped without a typed lifecycle error: {exc!r}") from exc
        finally:
            self.server.pump()
            self._retire_fault()
        if len(self.faults.fired) > fired:
            raise AssertionError(
                f"{label}: an injected fault in {self.faults.fired[-1]} raised, but the caller got no "
                f"error (machine in {self.lc.state.value})"
            )
        return True

    def _check_failure(self, label: str, exc: LifecycleError) -> None:
        lc = self.lc
        assert lc is not None
        _count("failures_after_fault")
        assert lc.state is S.FAILED, f"{label}: after an injected fault the machine is in {lc.state.value}, not Failed"
        failure = lc.failure
        assert failure is exc, f"{label}: the caller got {exc!r}, the machine recorded {failure!r}"
        assert failure.state is not None and failure.rank == lc.rank and failure.weight_version == lc.weight_version, (
            f"{label}: the error must name state, rank and weight version: {failure}"
        )
        text = str(failure)
        for part in (f"state={failure.state}", f"rank={lc.rank}", f"weight_version={lc.weight_version}"):
            assert part in text, f"{label}: {part!r} missing from the error message {text!r}"

    def _batch(self) -> list[int]:
        assert self.lc is not None
        return self.buffer.sample(self.lc.weight_version)

    def _latched(self, step: int, wv: int, at: int) -> None:
        """Oracle of the step's decisions, compared with what the machine latched."""
        lc = self.lc
        assert lc is not None
        if lc.checkpoint_decision.peek(step) is None:
            return  # the latch never ran (a fault before it)
        cfg = self.cfg
        periodic = cfg.checkpoint_every is not None and (step + 1) % cfg.checkpoint_every == 0
        deadline = self.deadline_at is not None and not self.deadline_fired and self.clock() >= self.deadline_at
        self.deadline_fired = self.deadline_fired or deadline
        rec = StepRecord(
            step=step,
            save=periodic or deadline,
            validate=cfg.validate_every is not None and (step + 1) % cfg.validate_every == 0,
            last=(cfg.num_steps is not None and step + 1 >= cfg.num_steps) or deadline,
            event_index=at,
            wv_before=wv,
        )
        self.steps.append(rec)
        got = (lc.facts[Fact.SAVE_THIS_STEP], lc.facts[Fact.VALIDATE_THIS_STEP], lc.facts[Fact.LAST_STEP])
        want = (rec.save, rec.validate, rec.last)
        assert got == want, f"step {step}: latched save/validate/last={got}, the rules say {want}"
        if rec.last:
            self.last_latched_at = at

    def _step_outcome(self, rec: StepRecord, *, inline: bool) -> None:
        """After a step that ran through: it saved iff decided, once, and ended where the decisions say."""
        lc = self.lc
        assert lc is not None
        rec.done = True
        saves = [
            e.detail
            for e in self.log.events[rec.event_index :]
            if e.name == "trainer.save_checkpoint" and e.phase == "ok"
        ]
        wv = rec.wv_before + 1
        want = [(rec.step + 1, wv)] if rec.save else []
        assert saves == want, (
            f"step {rec.step}: the latched decision said save={rec.save}, saves made: {saves} "
            f"(expected {want}: decided once, saved exactly once)"
        )
        assert lc.weight_version == wv, f"step {rec.step}: weight version {lc.weight_version}, expected {wv}"
        if rec.last:
            expected = S.DONE
        elif rec.validate and not (inline and self.cfg.inline_validator):
            expected = S.VALIDATING
        else:
            expected = S.GENERATING
        assert lc.state is expected, (
            f"step {rec.step} (save={rec.save} validate={rec.validate} last={rec.last}) "
            f"ended in {lc.state.value}, expected {expected.value}"
        )

    def _pending_step(self) -> StepRecord | None:
        return self.steps[-1] if self.steps and not self.steps[-1].done else None

    # ------------------------------------------------------------------ rules: the training loop
    @precondition(lambda self: self._at(S.CREATED))
    @rule()
    def start(self) -> None:
        lc = self.lc
        assert lc is not None
        self._drive("start", lc.start, coro=self.alc.start() if self.alc else None)

    @precondition(lambda self: self._at(S.GENERATING))
    @rule()
    def begin_step(self) -> None:
        lc = self.lc
        assert lc is not None
        step, wv, at = lc.step_index, lc.weight_version, len(self.log)
        self._drive("begin_step", lc.begin_step, coro=self.alc.fire("begin_step") if self.alc else None)
        self._latched(step, wv, at)

    @precondition(lambda self: self._at(S.DRAINING))
    @rule()
    def train(self) -> None:
        lc = self.lc
        assert lc is not None
        batch, wv = self._batch(), lc.weight_version
        trained = self.log.count("trainer", "train_step")
        ok = self._drive("train", lc.train, batch)
        self._after_train(batch, wv, trained, ok, inline=False)

    @precondition(lambda self: self._at(S.GENERATING))
    @rule()
    def whole_step(self) -> None:
        """``Lifecycle.step``: handoff, train, save, (inline validation), handoff back."""
        lc = self.lc
        assert lc is not None
        step, wv, at = lc.step_index, lc.weight_version, len(self.log)
        batch = self._batch()
        trained = self.log.count("trainer", "train_step")
        ok = self._drive("step", lc.step, batch, coro=self.alc.step(batch) if self.alc else None)
        self._latched(step, wv, at)
        self._after_train(batch, wv, trained, ok, inline=True)

    def _after_train(self, batch: list[int], wv: int, trained_before: int, ok: bool, *, inline: bool) -> None:
        if self.log.count("trainer", "train_step") > trained_before:
            self.buffer.trained_on(batch, wv)
            _count("steps_trained")
        else:
            self.buffer.give_back(batch)
        rec = self._pending_step()
        if ok and rec is not None:
            self._step_outcome(rec, inline=inline)

    @precondition(lambda self: self._at(S.VALIDATING))
    @rule()
    def end_validation(self) -> None:
        lc = self.lc
        assert lc is not None
        self._drive("end_validation", lc.end_validation, coro=self.alc.end_validation() if self.alc else None)

    @precondition(lambda self: self.lc is not None and self.lc.can("stop"))
    @rule(now=st.integers(0, 2))
    def stop(self, now: int) -> None:
        """Stop the run (a one-in-three draw, so programs get deep before they stop)."""
        lc = self.lc
        assert lc is not None
        if now:
            return
        self._drive("stop", lc.stop, coro=self.alc.stop() if self.alc else None)

    # ------------------------------------------------------------------ rules: the world around it
    @precondition(lambda self: self.lc is not None)
    @rule(
        event=st.one_of(
            st.tuples(st.just("time"), st.sampled_from([1.0, 2.0, 7.0, 30.0])),
            st.tuples(st.just("request"), st.just(1)),
            st.tuples(st.just("rollouts_admitted"), st.sampled_from([1, 7, 64])),
            st.tuples(st.just("rollouts_finish"), st.sampled_from([1, 7, 64])),
            st.tuples(st.just("fault"), st.sampled_from(_FAULT_DRAWS)),
            st.tuples(st.just("wrong_trigger"), st.sampled_from((*LIFECYCLE.triggers(), "fail", "no_such_trigger"))),
        )
    )
    def disturb(self, event: tuple[str, Any]) -> None:
        """Something happens around the machine. One rule for all of them, so the loop's own rules stay frequent.

        ``time``: the wall clock moves (the "must save by" deadline may pass); ``request``: an external agent calls
        the server (served now if the engine is awake, else on resume); ``rollouts_admitted``: the running
        collector admits groups up to the in-flight cap; ``rollouts_finish``: groups finish and their
        trajectories (tagged with the generating version) reach the buffer; ``fault``: the next call of one
        adapter method (or drain, barrier, validator) raises; ``wrong_trigger``: a trigger fired where it is not
        allowed.
        """
        kind, arg = event
        lc = self.lc
        assert lc is not None
        if kind == "time":
            self.clock.advance(float(arg))
        elif kind == "request":
            self.server.arrive()
            _count("requests")
        elif kind == "rollouts_admitted":
            if self.conditions.collector is C.RUNNING:
                room = max(0, self.cap.value - len(self.in_flight))
                self.in_flight.extend([lc.weight_version] * min(arg, room))
        elif kind == "rollouts_finish":
            done, self.in_flight = self.in_flight[:arg], self.in_flight[arg:]
            for v in done:
                self.buffer.add(1, v)
        elif kind == "fault":
            if type(self).inject_faults and self.faults.armed is None and lc.state is not S.STOPPED:
                self._arm(arg)
        else:
            self._wrong_trigger(arg)

    def _wrong_trigger(self, trigger: str) -> None:
        """A trigger fired from a state where it is not allowed: a typed error, and nothing changes."""
        lc = self.lc
        assert lc is not None
        if trigger in lc.spec.triggers(lc.state) and lc.can(trigger):
            return
        before = (lc.state, len(lc.trace), len(self.log), lc.weight_version, dict(lc.facts), lc.step_index)
        try:
            lc.fire(trigger)
        except (InvalidTransition, GuardRejected) as exc:
            assert exc.state == before[0].value and trigger in str(exc), f"error must name state and trigger: {exc}"
        else:
            raise AssertionError(f"trigger {trigger!r} from {before[0].value} was accepted")
        after = (lc.state, len(lc.trace), len(self.log), lc.weight_version, dict(lc.facts), lc.step_index)
        assert after == before, f"a refused trigger {trigger!r} changed the machine: {before} -> {after}"
        _count("wrong_triggers")

    # ------------------------------------------------------------------ invariants
    def _scan(self) -> None:
        """Feed new events to the audits; violations are kept per fact."""
        events = self.log.events
        v = self.violations
        for msg in self.audit.feed(events):
            v["handoff"].append(msg)
        for ev in events[self.scan_pos :]:
            self.scan_pos += 1
            if ev.phase != "call":
                continue
            name = ev.name
            if name == "engine.bring_up":
                self.builds += 1
                if self.builds > 1:
                    v["build_once"].append(f"event {ev.index}: engine.bring_up called {self.builds} times")
            elif name == "engine.shutdown" and ev.state != S.STOPPED.value:
                v["teardown"].append(f"event {ev.index}: engine.shutdown in {ev.state} (only at Stopped)")
            elif name in ("trainer.train_step", "trainer.save_checkpoint"):
                real = (ev.real_engine, ev.real_collector)
                if ev.engine is E.AWAKE or ev.collector is C.RUNNING or real[0] == "awake" or real[1] == "running":
                    fact = "checkpoint_suspends" if name.endswith("save_checkpoint") else "no_decode_during_train"
                    v[fact].append(
                        f"event {ev.index}: {name} in {ev.state} with engine {ev.engine.value} "
                        f"(adapter says {real[0]}) and collector {ev.collector.value} "
                        f"(adapter says {real[1]})"
                    )
            elif name in ("engine.resume", "collector.resume"):
                if self.last_latched_at is not None and ev.index > self.last_latched_at:
                    v["last_step"].append(f"event {ev.index}: {name} in {ev.state} after the last step latched")
                if self.builds == 0:
                    v["build_once"].append(f"event {ev.index}: {name} before the engine was built")
            elif name == "validator.validate" and (ev.engine is not E.AWAKE or ev.collector is not C.PAUSED):
                v["validation_wake"].append(
                    f"event {ev.index}: validation with engine {ev.engine.value}, "
                    f"collector {ev.collector.value} (awake, paused expected)"
                )

    def _assert_fact(self, fact: str) -> None:
        if self.lc is None:
            return
        self._scan()
        if self.violations.get(fact):
            raise AssertionError(
                f"lifecycle fact violated ({fact}):\n  "
                + "\n  ".join(self.violations[fact][:5])
                + "\n  recent calls:\n"
                + "\n".join(self.log.lines(max(0, len(self.log) - 30)))
            )

    @invariant()
    @checks(LifecycleRule.BUILD_ONCE)
    def build_once(self) -> None:
        """The engine comes up exactly once, before collection."""
        self._assert_fact("build_once")

    @invariant()
    @checks(LifecycleRule.BUILD_ONCE)
    def server_urls_published(self) -> None:
        """The per-rank server base URLs the engine reports are published as dp_openai_server_base_urls."""
        lc = self.lc
        if lc is None or self.engine.published is None:
            return
        assert lc.dp_openai_server_base_urls == self.engine.published, (
            f"published {lc.dp_openai_server_base_urls}, the engine reported {self.engine.published}"
        )

    @invariant()
    @checks(LifecycleRule.BUILD_ONCE)
    def teardown_only_at_stop(self) -> None:
        """Teardown only at Stopped (never at a validation boundary)."""
        self._assert_fact("teardown")

    @invariant()
    @checks(LifecycleRule.ONE_COMMUNICATOR)
    def drain_own_device_then_barrier(self) -> None:
        """Drain the LOCAL_RANK device before every barrier; drain + barrier before every phase signal."""
        self._assert_fact("handoff")

    @invariant()
    @checks(LifecycleRule.ONE_COMMUNICATOR)
    def no_decode_during_training(self) -> None:
        """No decode in flight (engine awake / collector running) while a training step runs."""
        self._assert_fact("no_decode_during_train")

    @invariant()
    @checks(LifecycleRule.CHECKPOINT_SUSPENDS)
    def checkpoint_suspends_everything(self) -> None:
        """During every save the engine is suspended and the collector paused."""
        self._assert_fact("checkpoint_suspends")

    @invariant()
    @checks(LifecycleRule.CHECKPOINT_SUSPENDS)
    def last_step_never_wakes(self) -> None:
        """Nothing resumes after the last step latched."""
        self._assert_fact("last_step")

    @invariant()
    @checks(LifecycleRule.CHECKPOINT_SUSPENDS)
    def validation_runs_awake_collector_paused(self) -> None:
        """A validation-only wake: the engine awake, the collector still paused."""
        self._assert_fact("validation_wake")

    @invariant()
    @checks(LifecycleRule.STEP_ORDER_IS_DATA)
    def adapter_conditions_match_spec(self) -> None:
        """The adapters' real conditions are the ones the current state declares (Failed: documented below)."""
        lc = self.lc
        if lc is None or lc.state is S.FAILED:
            return
        decl = lc.spec.state(lc.state)
        real_engine, real_collector = self._probe()
        engine_ok = {decl.engine}
        if decl.engine is E.TORN_DOWN and self.log.count("engine", "bring_up") == 0:
            engine_ok.add(E.ABSENT)  # stopped before anything was built
        tracked = self.conditions
        problems = []
        if tracked.engine not in engine_ok:
            problems.append(f"engine {tracked.engine.value} (declared {decl.engine.value})")
        if real_engine is not None and real_engine not in {c.value for c in engine_ok}:
            problems.append(f"engine reports {real_engine} (declared {decl.engine.value})")
        if lc.engine_condition is not decl.engine:
            problems.append(f"machine believes engine {lc.engine_condition.value} (declared {decl.engine.value})")
        if self.collector is not None:
            if tracked.collector is not decl.collector:
                problems.append(f"collector {tracked.collector.value} (declared {decl.collector.value})")
            if real_collector is not None and real_collector != decl.collector.value:
                problems.append(f"collector reports {real_collector} (declared {decl.collector.value})")
        assert not problems, f"in {lc.state.value}: " + "; ".join(problems)

    @invariant()
    def failure_leaves_documented_condition(self) -> None:
        """After a failure: engine not awake and collector paused (best-effort local quiesce, no barrier)."""
        lc = self.lc
        if lc is None or lc.state is not S.FAILED:
            return
        assert lc.failure is not None, "Failed without a recorded failure"
        if lc.engine_condition is not E.UNKNOWN:
            assert self.conditions.engine is not E.AWAKE, "Failed with the engine still awake"
        if lc.collector_condition is not C.UNKNOWN and self.collector is not None:
            assert self.conditions.collector is not C.RUNNING, "Failed with the collector still running"
        assert self.faults.fired, "Failed although no fault was injected"

    @invariant()
    @checks(LifecycleRule.DECIDE_ONCE)
    def save_decision_reused(self) -> None:
        """A second site asking the latched checkpoint decision gets the same answer."""
        lc = self.lc
        if lc is None or not self.steps:
            return
        rec = self.steps[-1]
        again = lc.checkpoint_decision.decide(rec.step)
        assert again == rec.save, (
            f"step {rec.step}: the checkpoint decision latched save={rec.save}, a second "
            f"query now says {again} (decide once, reuse everywhere)"
        )

    @invariant()
    @checks(LifecycleRule.WEIGHT_VERSIONS)
    def weight_version_once_per_step(self) -> None:
        """Each trained step bumps the weight version exactly once."""
        lc = self.lc
        if lc is None:
            return
        trained = self.log.count("trainer", "train_step")
        assert lc.weight_version == self.cfg.start_weight_version + trained, (
            f"weight version {lc.weight_version} after {trained} training steps from {self.cfg.start_weight_version}"
        )

    @invariant()
    @checks(LifecycleRule.WEIGHT_VERSIONS)
    def trajectories_accounted(self) -> None:
        """No trajectory lost; none older than max_trajectory_age_steps trained on (stale ones counted)."""
        if self.lc is None:
            return
        b = self.buffer
        assert b.accounted, (
            f"trajectories lost: produced {b.produced}, trained {b.trained}, stale {b.stale}, waiting {len(b.waiting)}"
        )
        assert b.max_trained_age <= b.max_age_steps, f"trained on a trajectory {b.max_trained_age} versions old"

    @invariant()
    @checks(LifecycleRule.BOUNDED_INFLIGHT)
    def in_flight_within_actor_capacity(self) -> None:
        """In-flight groups within the age bound and the actor's capacity, headroom kept for control."""
        if self.lc is None:
            return
        cfg, n = self.cfg, len(self.in_flight)
        calls = n * cfg.samples_per_group
        assert n <= cfg.num_prompts_per_step * cfg.max_trajectory_age_steps, (
            f"{n} groups in flight exceed the age bound"
        )
        assert calls <= cfg.actor_max_concurrency - cfg.control_headroom, (
            f"{n} groups x {cfg.samples_per_group} samples = {calls} calls in flight on an actor running "
            f"{cfg.actor_max_concurrency} at once with {cfg.control_headroom} kept for control: lifecycle control "
            f"calls would queue behind rollouts (cap {self.cap.explain()})"
        )

    @invariant()
    @checks(LifecycleRule.PARK_NOT_DRAIN)
    def requests_served_only_while_awake(self) -> None:
        """No request is decoded while the engine is suspended; a waiting request is served once it is awake."""
        if self.lc is None:
            return
        bad = [r for r in self.server.served if not r.engine_awake]
        assert not bad, f"requests served while the engine was suspended: {bad[:3]}"
        if self.conditions.engine is E.AWAKE:
            assert not self.server.pending, "requests left waiting while the engine is awake"

    @invariant()
    def trace_consistent(self) -> None:
        """Trace records chain source->dest, follow declared transitions, and carry rank and versions."""
        lc = self.lc
        if lc is None:
            return
        records = lc.trace.records
        spec = lc.spec
        edges = {(t.trigger, t.source.value, t.dest.value) for t in spec.transitions}
        prev_dest = records[self.trace_pos - 1].dest if self.trace_pos else spec.initial.value
        prev_seq = records[self.trace_pos - 1].seq if self.trace_pos else 0
        prev_wv = records[self.trace_pos - 1].weight_version if self.trace_pos else self.cfg.start_weight_version
        for r in records[self.trace_pos :]:
            where = f"trace record {r.seq} ({r.source} -[{r.trigger}]-> {r.dest})"
            assert r.seq == prev_seq + 1, f"{where}: seq after {prev_seq}"
            assert r.source == prev_dest, f"{where}: source is not the previous record's destination {prev_dest}"
            assert r.rank == lc.rank, f"{where}: rank {r.rank}"
            assert r.t_start <= r.t_enter <= r.t_end, f"{where}: times out of order"
            assert r.weight_version >= prev_wv, f"{where}: weight version went back"
            if r.trigger == spec.fail_trigger:
                assert r.dest == spec.failed.value and not r.ok and r.error, f"{where}: a failure record"
            else:
                assert (r.trigger, r.source, r.dest) in edges, f"{where}: not a declared transition"
                assert r.ok or r.error, f"{where}: failed without an error"
            prev_dest, prev_seq, prev_wv = r.dest, r.seq, r.weight_version
        self.trace_pos = len(records)
        if records:
            assert records[-1].dest == lc.state.value, (
                f"last trace record ends in {records[-1].dest}, machine in {lc.state.value}"
            )

    @invariant()
    def never_stuck(self) -> None:
        """The machine rests only where a user trigger can move it on (or at a terminal state / Failed)."""
        lc = self.lc
        if lc is None:
            return
        state = lc.state
        auto = [t for t in lc.spec.outgoing(state) if t.automatic and t.enabled(lc.facts)]
        assert not auto, f"resting in {state.value} with automatic transition(s) enabled: {auto}"
        if state is S.FAILED or lc.spec.state(state).terminal:
            return
        movable = [t for t in lc.spec.outgoing(state) if not t.automatic and t.enabled(lc.facts)]
        assert movable, f"stuck in {state.value}: no transition can leave it (facts {lc.status().facts})"


# ---------------------------------------------------------------------------------------------- entry points
def lifecycle_machine(
    factory: AdapterFactory | None = None,
    *,
    base: type[LifecycleMachine] = LifecycleMachine,
    name: str | None = None,
    **attrs: Any,
) -> type[LifecycleMachine]:
    """A :class:`LifecycleMachine` subclass for ``factory``'s adapters (``attrs`` override class settings)."""
    body: dict[str, Any] = dict(attrs)
    if factory is not None:
        body["adapters_factory"] = staticmethod(factory)
    for key in ("adapters_factory",):
        if key in body and not isinstance(body[key], staticmethod):
            body[key] = staticmethod(body[key])
    return type(name or f"{base.__name__}For{getattr(factory, '__name__', 'Adapters').title()}", (base,), body)


def lifecycle_test_case(
    factory: AdapterFactory | None = None,
    *,
    profile: str | None = None,
    base: type[LifecycleMachine] = LifecycleMachine,
    **attrs: Any,
) -> type[Any]:
    """A ``unittest.TestCase`` running the lifecycle machine on ``factory``'s adapters with a colo-fsm profile.

    Assign it to a module-level name starting with ``Test`` and pytest collects it::

        TestMyAdapters = lifecycle_test_case(make_my_adapters)
    """
    machine = lifecycle_machine(factory, base=base, **attrs)
    case = machine.TestCase
    case.settings = lifecycle_settings(profile)
    return case


def check_lifecycle(
    factory: AdapterFactory | None = None,
    *,
    settings: Settings | None = None,
    profile: str | None = None,
    base: type[LifecycleMachine] = LifecycleMachine,
    **attrs: Any,
) -> None:
    """Run the lifecycle machine now (inside any test); raises with a minimal failing program."""
    machine = lifecycle_machine(factory, base=base, **attrs)
    run_state_machine_as_test(machine, settings=settings or lifecycle_settings(profile))


def stats_snapshot() -> dict[str, int]:
    """A copy of :data:`STATS`."""
    with _STATS_LOCK:
        return dict(STATS)


__all__ = [
    "FAULT_PATIENCE",
    "STATS",
    "AdapterFactory",
    "Adapters",
    "LifecycleMachine",
    "RunConfig",
    "StepRecord",
    "as_adapters",
    "callable_targets",
    "check_lifecycle",
    "lifecycle_machine",
    "lifecycle_test_case",
    "recording_fakes",
    "run_configs",
    "stats_snapshot",
]
