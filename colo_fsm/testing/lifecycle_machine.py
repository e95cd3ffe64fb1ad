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
import dataclasses
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
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
from colo_fsm.guards.engine_state import engine_state_of
from colo_fsm.machine.aio import AsyncLifecycle
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.presets import PRESETS
from colo_fsm.states.rules import LifecycleRule, checks
from colo_fsm.states.spec import (
    LIFECYCLE,
    CollectorCondition,
    EngineCondition,
    Fact,
    LifecycleSpec,
    RequestCondition,
    Role,
    State,
)
from colo_fsm.states.walk import last_step_validates, walk_step
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
    FAULT_TARGETS,
    VALIDATOR_TARGET,
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
    fault_targets,
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
    rollout: Callable[[], Any] | None = None  # start one rollout on your collector (it issues nothing when paused)
    decode: Callable[[], Any] | None = None  # let your engine run one decode step of its own loop
    decode_probe: Callable[[], int] | None = None  # decode steps your engine has run so far
    request_probe: Callable[[], Any] | None = None  # your engine's request_counts() (queued, running, parked)


AdapterFactory = Callable[..., Any]
"""A callable returning :class:`Adapters` or an ``(engine, trainer, collector)`` tuple. It takes no argument,
or one: the :class:`KitHandle` of the program, whose ``lifecycle`` is set once the machine has built it."""


@dataclass
class KitHandle:
    """What the kit hands your factories (adapters, checkpoint, validation, early stop, drain, validator): the
    spec it runs, the rank and local rank, and the lifecycle it builds for the program (set right after it is
    built, before anything runs: a rule or validator reads it when it is called, e.g. ``last_validation``)."""

    spec: LifecycleSpec
    lifecycle: Lifecycle | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    local_rank: int = 0

    @property
    def last_validation(self) -> Any:
        """The lifecycle's latest validation metrics (None before the first validation)."""
        return self.lifecycle.last_validation if self.lifecycle is not None else None

    @property
    def step(self) -> int:
        """The lifecycle's step index (steps trained so far, from ``start_step``)."""
        return self.lifecycle.step_index if self.lifecycle is not None else 0


def recording_fakes(*, engine_up: bool = False) -> Adapters:
    """The recording fakes of :mod:`colo_fsm.testing.fakes`, with probes reading their own conditions
    (``engine_up``: the engine is built in its constructor, for a spec that adopts it)."""
    j = Journal()
    engine = RecordingEngine(j, urls=["http://127.0.0.1:8000/v1"], up=engine_up)
    collector = RecordingCollector(j, engine=engine)
    return Adapters(engine, RecordingTrainer(j), collector)


def spec_fakes(handle: KitHandle | None = None) -> Adapters:
    """:func:`recording_fakes` shaped for the handle's spec (the engine up at construction when it adopts one)."""
    return recording_fakes(engine_up=handle is not None and handle.spec.engine_up_at_construction)


def _required_positional(factory: Callable[..., Any]) -> int:
    """Positional parameters the kit fills: the required ones, and one named ``handle`` even with a default."""
    try:
        return len(
            [
                p
                for p in inspect.signature(factory).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and (p.default is p.empty or p.name == "handle")
            ]
        )
    except (TypeError, ValueError):
        return 0


def _call_factory(factory: Callable[..., Any], *args: Any) -> Any:
    """Call ``factory`` with as many of ``args`` as it takes required positional parameters (the handle last for
    a drain factory: ``drain_factory(local_rank)`` or ``drain_factory(local_rank, handle)``)."""
    return factory(*args[: _required_positional(factory)])


def build_components(
    handle: KitHandle,
    *,
    checkpoint_factory: Callable[..., Any] | None = None,
    validation_factory: Callable[..., Any] | None = None,
    early_stop_factory: Callable[..., Any] | None = None,
    drain_factory: Callable[..., Any] | None = None,
    validator_factory: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Your components for one program, each factory called with the program's :class:`KitHandle` (when it takes
    an argument; ``drain_factory`` with the local rank, then the handle): only the ones you gave."""
    out: dict[str, Any] = {}
    for key, factory in (
        ("checkpoint", checkpoint_factory),
        ("validation", validation_factory),
        ("early_stop", early_stop_factory),
        ("validator", validator_factory),
    ):
        if factory is not None:
            out[key] = _call_factory(factory, handle)
    if drain_factory is not None:
        out["drain"] = _call_factory(drain_factory, handle.local_rank, handle)
    return out


def as_adapters(obj: Any) -> Adapters:
    """Normalize a factory's result; derive probes from the adapters' own attributes when present.

    The engine's report of its condition (``engine_state()`` or ``condition``, see
    :func:`~colo_fsm.guards.engine_state.engine_state_of`) and ``running`` (collector) become condition probes; a collector's ``start_rollout``
    the rollout hook; an engine's ``decode_step``, ``decode_steps`` and ``request_counts`` the decode hook and
    the decode and request probes.
    """
    ad = obj if isinstance(obj, Adapters) else Adapters(*obj)
    engine_ = ad.engine
    if ad.rollout is None and ad.collector is not None and callable(getattr(ad.collector, "start_rollout", None)):
        ad.rollout = ad.collector.start_rollout
    if ad.decode is None and callable(getattr(engine_, "decode_step", None)):
        ad.decode = engine_.decode_step
    if ad.decode_probe is None and isinstance(getattr(engine_, "decode_steps", None), int):
        ad.decode_probe = lambda: int(engine_.decode_steps)
    if ad.request_probe is None and callable(getattr(engine_, "request_counts", None)):
        ad.request_probe = engine_.request_counts
    if ad.engine_probe is None and engine_state_of(ad.engine) is not None:  # the engine's own report, either form
        engine = ad.engine

        def engine_probe() -> EngineCondition | None:
            report = engine_state_of(engine)
            return report.condition if report is not None else None

        ad.engine_probe = engine_probe
    if (
        ad.collector is not None
        and ad.collector_probe is None
        and isinstance(getattr(ad.collector, "running", None), bool)
    ):
        collector = ad.collector
        ad.collector_probe = lambda: "running" if collector.running else "paused"
    return ad


# ---------------------------------------------------------------------------------------------- fault targets
_VALIDATOR_TARGET = VALIDATOR_TARGET
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
    targets = {a: call for call, a in spec.adapter_calls().items()}
    found = {targets[a] for a in actions if a in targets}
    if inline_validator and any(spec.state(x).validates for x in seen):
        found.add(_VALIDATOR_TARGET)
    result = tuple(t for t in fault_targets(spec) if t in found)
    _CALLABLE[key] = result
    return result


_ALL_TRIGGERS: tuple[str, ...] = tuple(dict.fromkeys(t for spec in PRESETS.values() for t in spec.triggers()))


def _watched_drain(
    inner: Callable[[], object], local_rank: int, log: EventLog, faults: FaultSwitch
) -> Callable[[], object]:
    """Your drain, journaled as a ``device.synchronize`` of the device it names (``target_device()``, else
    ``local_rank``)."""
    target = getattr(inner, "target_device", None)

    def drain() -> object:
        device = int(target()) if callable(target) else local_rank
        log.add("device", "synchronize", "call", device)
        try:
            faults.check("device", "synchronize")
            out = inner()
        except BaseException as exc:
            log.add("device", "synchronize", "error", f"{type(exc).__name__}: {exc}")
            raise
        log.add("device", "synchronize", "ok", device)
        return out

    return drain


def _fit_config(cfg: RunConfig, spec: LifecycleSpec, *, user_validation: bool = False) -> RunConfig:
    """Drop the drawn options a spec has no place for (the lifecycle refuses them): validation at start or at
    the end, and an early stop in a spec without one or a run that never validates."""
    import dataclasses

    decided = {f for a in spec.actions for f in a.decides}
    changes: dict[str, Any] = {}
    if Fact.VALIDATE_AT_START not in decided:
        changes["val_at_start"] = False
    if cfg.val_at_end and not last_step_validates(spec):
        changes["val_at_end"] = False
    cfg = dataclasses.replace(cfg, **changes) if changes else cfg
    validates = user_validation or cfg.validate_every is not None or cfg.val_at_start or cfg.val_at_end
    if Fact.STOP_EARLY not in decided or not validates:
        return dataclasses.replace(cfg, early_stop_at=None, save_on_early_stop=None)
    at, every = cfg.early_stop_at, cfg.validate_every
    if at is not None and every is not None and not (at == 0 and cfg.val_at_start and cfg.start_step == 0):
        # where a validation asks it: the first validating step at or after the drawn one (steps trained)
        at = max(at, cfg.start_step + 1)
        cfg = dataclasses.replace(cfg, early_stop_at=at + (-at) % every)
    return cfg


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
    val_at_start: bool = False  # used when the spec decides validate_at_start
    val_at_end: bool = False
    early_stop_at: int | None = None  # steps trained when the early-stop latch says stop (0: at start)
    save_on_early_stop: bool | None = None  # LifecycleConfig's: None saves an early stop iff the run checkpoints


@st.composite
def run_configs(draw: st.DrawFn) -> RunConfig:
    """Strategy for :class:`RunConfig`."""
    num_steps = draw(st.one_of(st.none(), st.integers(1, 6)))
    start_step = draw(st.integers(0, (num_steps - 1) if num_steps else 3)) if draw(st.booleans()) else 0
    amc = draw(st.sampled_from([16, 64, 256, 1000]))
    spg = draw(st.integers(1, 16))
    cfg = RunConfig(
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
        val_at_start=draw(st.booleans()),
        val_at_end=draw(st.booleans()),
        early_stop_at=draw(st.one_of(st.none(), st.integers(0, 5))),
    )
    # derived, not drawn: a draw of its own would move every derandomized program after it
    derived = (True, None, True, False)[(amc + spg + cfg.num_prompts_per_step) % 4]
    return dataclasses.replace(cfg, save_on_early_stop=derived)


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
    early_stop: bool = False  # the early-stop latch (after validation) will say stop


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
    * ``async_training``: passed to :class:`LifecycleConfig` (False for engines that refit weights);
    * your components, used instead of the kit's own when given: ``barrier_factory()`` (a Barrier),
      ``drain_factory(local_rank[, handle])`` (a drain callable), ``validator(step, weight_version)`` or
      ``validator_factory(handle)`` (returning one), ``checkpoint_factory(handle)``, ``validation_factory(handle)``,
      ``early_stop_factory(handle)`` (LatchedDecisions; the oracle then reads their latched answers; each factory
      may also take no argument) and ``batch_factory(trajectories, step)`` (the batch your ``train_step`` gets;
      by default the list of the weight versions of the trajectories the replay buffer handed out, a
      ``list[int]``). The handle is the program's :class:`KitHandle`; its ``lifecycle`` is set before anything
      runs, so a rule reads it when it is asked.
    """

    adapters_factory: ClassVar[AdapterFactory] = spec_fakes
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
    barrier_factory: ClassVar[Callable[[], Any] | None] = None
    drain_factory: ClassVar[Callable[..., Callable[[], object]] | None] = None
    validator: ClassVar[Callable[[int, int], Any] | None] = None
    validator_factory: ClassVar[Callable[..., Callable[[int, int], Any]] | None] = None
    checkpoint_factory: ClassVar[Callable[..., LatchedDecision] | None] = None
    validation_factory: ClassVar[Callable[..., LatchedDecision] | None] = None
    early_stop_factory: ClassVar[Callable[..., LatchedDecision] | None] = None
    batch_factory: ClassVar[Callable[[list[int], int], Any] | None] = None

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
        spec = cls.spec
        decided = {f for a in spec.actions for f in a.decides}
        cfg = _fit_config(cfg, spec, user_validation=cls.validation_factory is not None)
        self.cfg = cfg
        self.handle = KitHandle(spec, local_rank=cls.local_rank)
        self.ad = as_adapters(_call_factory(cls.adapters_factory, self.handle))
        self.conditions = Conditions(engine=spec.state(spec.initial).engine)
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
        runs_early_stop = Fact.STOP_EARLY in decided and (
            cls.validation_factory is not None or cfg.validate_every is not None or cfg.val_at_start or cfg.val_at_end
        )
        user = build_components(
            self.handle,
            checkpoint_factory=cls.checkpoint_factory,
            validation_factory=cls.validation_factory,
            early_stop_factory=cls.early_stop_factory if runs_early_stop else None,
            drain_factory=cls.drain_factory,
            validator_factory=cls.validator_factory,
        )
        if "drain" in user:
            drain = _watched_drain(user["drain"], cls.local_rank, self.log, self.faults)
        else:
            drain = cls.drain_class(cls.local_rank, synchronize=watched_synchronize(self.log, self.faults))
        inner_barrier = cls.barrier_factory() if cls.barrier_factory is not None else SoloBarrier()
        self.user_decisions = {key: key in user for key in ("checkpoint", "validation", "early_stop")}
        self.user_validator = user.get("validator", cls.validator)
        checkpoint = user.get("checkpoint") or cls.checkpoint_class(
            cfg.checkpoint_every, must_save_by_s=cfg.must_save_by_s, clock=self.clock
        )
        validation = user.get("validation") or ValidationDecision(cfg.validate_every)
        early_stop: LatchedDecision | None = None
        if runs_early_stop:
            at = cfg.early_stop_at
            early_stop = user.get("early_stop") or LatchedDecision(
                "early_stop", lambda step: at is not None and step == at
            )
        self.lc = cls.lifecycle_class(
            self.engine,
            self.trainer,
            self.collector,
            config=LifecycleConfig(
                num_steps=cfg.num_steps,
                start_step=cfg.start_step,
                start_weight_version=cfg.start_weight_version,
                async_training=cls.async_training,
                val_at_start=cfg.val_at_start,
                val_at_end=cfg.val_at_end,
                save_on_early_stop=cfg.save_on_early_stop if early_stop is not None else None,
            ),
            drain=drain,
            barrier=WatchedBarrier(inner_barrier, self.log, self.faults),
            checkpoint=checkpoint,
            validation=validation,
            validator=self._validator if cfg.inline_validator else None,
            early_stop=early_stop,
            spec=cls.spec,
            check_spec=cls.check_spec,
        )
        self.handle.lifecycle = self.lc
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
        self.adopts = spec.engine_up_at_construction  # the engine came up in its constructor: never built here
        self.last_latched_at: int | None = None
        self.validations = 0
        self.fault_waited = 0
        self.decode_seen = self._decode_count()
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

    def _can_fire(self, trigger: str) -> bool:
        """Whether ``trigger`` leaves the current state in the spec (its guards aside)."""
        return self.lc is not None and self.lc.state is not S.FAILED and trigger in self.lc.spec.triggers(self.lc.state)

    def _callable_targets(self) -> tuple[tuple[str, str], ...]:
        assert self.lc is not None
        cfg = self.cfg
        targets = callable_targets(self.lc.spec, self.lc.state, inline_validator=cfg.inline_validator)
        never = set()  # calls the rest of this run never makes: its decisions save or validate at no step left
        if any(self.user_decisions.values()):
            return targets
        spec = self.lc.spec
        first = self.lc.step_index
        ahead = range(first, cfg.num_steps if cfg.num_steps is not None else first + 60)
        stops_early = cfg.early_stop_at is not None and any(
            f is Fact.STOP_EARLY for a in spec.actions for f in a.decides
        )
        if (
            cfg.must_save_by_s is None
            and not stops_early
            and not (cfg.checkpoint_every and any((s + 1) % cfg.checkpoint_every == 0 for s in ahead))
        ):
            never.add(("trainer", "save_checkpoint"))
            never.add(("trainer", "finalize_checkpoint"))
        last_validates = cfg.val_at_end and last_step_validates(spec)
        not_last = ahead[:-1] if cfg.num_steps is not None and not last_validates else ahead
        at_start = cfg.val_at_start and self.lc.state in (S.CREATED, S.STARTING)
        if not at_start and not (
            (cfg.validate_every and any((s + 1) % cfg.validate_every == 0 for s in not_last))
            or (last_validates and cfg.num_steps is not None)
        ):
            never.add(_VALIDATOR_TARGET)
        return tuple(t for t in targets if t not in never)

    def _arm(self, drawn: tuple[str, str]) -> None:
        """Arm ``drawn``, or (when no call of it can come any more) a target that can still be called."""
        targets = self._callable_targets()
        if not targets:
            return
        # only a call that can still happen: one that never comes would block every other fault. A drawn target
        # that cannot stands for one that can (a fixed map, so programs still shrink).
        index = FAULT_TARGETS.index(drawn) if drawn in FAULT_TARGETS else len(FAULT_TARGETS)
        target = drawn if drawn in targets else targets[index % len(targets)]
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

    def _validator(self, step: int, weight_version: int) -> Any:
        self.log.add("validator", "validate", "call", (step, weight_version))
        self.faults.check("validator", "validate")
        self.validations += 1
        user = self.user_validator
        if user is not None:
            return user(step, weight_version)
        return {"accuracy": 1.0}

    def _decode_count(self) -> int | None:
        ad = self.ad
        return int(ad.decode_probe()) if ad is not None and ad.decode_probe is not None else None

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

    def _user_batch(self, trajectories: list[int]) -> Any:
        """The batch ``train_step`` gets: your ``batch_factory(trajectories, step)``, else the trajectories."""
        factory = type(self).batch_factory
        assert self.lc is not None
        return factory(list(trajectories), self.lc.step_index) if factory is not None else trajectories

    def _latched(self, step: int, wv: int, at: int) -> None:
        """Oracle of the step's decisions, compared with what the machine latched."""
        lc = self.lc
        assert lc is not None
        if lc.checkpoint_decision.peek(step) is None:
            return  # the latch never ran (a fault before it)
        cfg = self.cfg
        user = self.user_decisions
        if user["checkpoint"]:
            save = bool(lc.checkpoint_decision.peek(step))
            deadline = isinstance(lc.checkpoint_decision, CheckpointDecision) and lc.checkpoint_decision.stops_run(step)
        else:
            periodic = cfg.checkpoint_every is not None and (step + 1) % cfg.checkpoint_every == 0
            deadline = self.deadline_at is not None and not self.deadline_fired and self.clock() >= self.deadline_at
            self.deadline_fired = self.deadline_fired or deadline
            save = periodic or deadline
        last = (cfg.num_steps is not None and step + 1 >= cfg.num_steps) or deadline
        if user["validation"]:
            validate = bool(lc.validation_decision.peek(step))
        else:
            validate = cfg.validate_every is not None and (step + 1) % cfg.validate_every == 0
        validate = validate or (last and cfg.val_at_end)
        rec = StepRecord(
            step=step,
            save=save,
            validate=validate,
            last=last,
            event_index=at,
            wv_before=wv,
            early_stop=lc.early_stop is not None and not user["early_stop"] and cfg.early_stop_at == step + 1,
        )
        self.steps.append(rec)
        got = (lc.facts[Fact.SAVE_THIS_STEP], lc.facts[Fact.VALIDATE_THIS_STEP], lc.facts[Fact.LAST_STEP])
        stops = lc.early_stop is not None and lc.facts[Fact.STOP_EARLY]  # latched after validation: save-and-stop
        want = (rec.save or (stops and lc.saves_on_early_stop), rec.validate, rec.last or stops)
        assert got == want, f"step {step}: latched save/validate/last={got}, the rules say {want}"
        if rec.last:
            self.last_latched_at = at

    def _expected_rest(self, rec: StepRecord, *, inline: bool) -> State:
        """Where the spec says the step rests, walked over the declared effects with the oracle's decisions."""
        lc = self.lc
        assert lc is not None
        spec = lc.spec
        stop_latched = rec.early_stop
        if self.user_decisions["early_stop"] and lc.early_stop is not None:
            stop_latched = bool(lc.early_stop.peek(rec.step + 1))  # asked with the steps trained, as the validator
        decisions = {
            Fact.SAVE_THIS_STEP: rec.save,
            Fact.VALIDATE_THIS_STEP: rec.validate,
            Fact.LAST_STEP: rec.last,
            Fact.STOP_EARLY: stop_latched,
        }
        return walk_step(spec, decisions, through_validation=inline, save_on_stop=lc.saves_on_early_stop)

    def _step_outcome(self, rec: StepRecord, *, inline: bool) -> None:
        """After a step that ran through: it saved iff decided, once, and rests where the spec says.

        A step resting in a validation-only state is checked again when it leaves it (its early-stop latch and
        save, in a validate-before-save spec, come after the validation).
        """
        lc = self.lc
        assert lc is not None
        spec = lc.spec
        expected = self._expected_rest(rec, inline=inline)
        assert lc.state is expected, (
            f"step {rec.step} (save={rec.save} validate={rec.validate} last={rec.last} early_stop={rec.early_stop}) "
            f"rests in {lc.state.value}; the spec's declared effects say {expected.value}"
        )
        wv = rec.wv_before + 1
        assert lc.weight_version == wv, f"step {rec.step}: weight version {lc.weight_version}, expected {wv}"
        if spec.state(lc.state).validates:
            return  # the step is not over yet
        rec.done = True
        events = self.log.events[rec.event_index :]
        saves = [e.detail for e in events if e.name == "trainer.save_checkpoint" and e.phase == "ok"]
        stops = lc.facts.get(Fact.STOP_EARLY, False) if lc.early_stop is not None else False
        validated = any(spec.state(e.state).validates for e in events)
        if rec.early_stop and validated and spec.with_role(Role.LATCH_STOP):
            assert stops, f"step {rec.step}: the early-stop decision said stop after validation, the machine did not"
        want = [(rec.step + 1, wv)] if rec.save or (stops and lc.saves_on_early_stop) else []
        assert saves == want, (
            f"step {rec.step}: the latched decisions said save={rec.save} early_stop={stops}, saves made: {saves} "
            f"(expected {want}: decided once, saved exactly once; an early stop saves and ends the run)"
        )
        if stops:
            assert spec.state(lc.state).final, f"step {rec.step}: an early stop latched, the run rests in {lc.state}"
        if saves and spec.validate_before_save and rec.validate:
            first_save = next(e.index for e in events if e.name == "trainer.save_checkpoint")
            woke = any(spec.state(e.state).validates for e in events if e.index < first_save)
            assert woke, f"step {rec.step}: saved before its validation (this spec validates before the save)"
        if saves and spec.with_role(Role.FINALIZE):
            last_save = max(e.index for e in events if e.name == "trainer.save_checkpoint")
            finalized = any(e.name == "trainer.finalize_checkpoint" and e.index > last_save for e in events)
            assert finalized, f"step {rec.step}: the async save was never finalized (every collective before a wake)"

    def _pending_step(self) -> StepRecord | None:
        return self.steps[-1] if self.steps and not self.steps[-1].done else None

    # ------------------------------------------------------------------ rules: the training loop
    @precondition(lambda self: self._at(S.CREATED))
    @rule()
    def start(self) -> None:
        lc = self.lc
        assert lc is not None
        self._drive("start", lc.start, coro=self.alc.start() if self.alc else None)

    @precondition(lambda self: self._can_fire("begin_step"))
    @rule()
    def begin_step(self) -> None:
        lc = self.lc
        assert lc is not None
        step, wv, at = lc.step_index, lc.weight_version, len(self.log)
        self._drive("begin_step", lc.begin_step, coro=self.alc.fire("begin_step") if self.alc else None)
        self._latched(step, wv, at)

    @precondition(lambda self: self._can_fire("train"))
    @rule()
    def train(self) -> None:
        lc = self.lc
        assert lc is not None
        batch, wv = self._batch(), lc.weight_version
        trained = self.log.count("trainer", "train_step")
        ok = self._drive("train", lc.train, self._user_batch(batch))
        self._after_train(batch, wv, trained, ok, inline=False)

    @precondition(lambda self: self._can_fire("begin_step"))
    @rule()
    def whole_step(self) -> None:
        """``Lifecycle.step``: handoff, train, save, (inline validation), handoff back."""
        lc = self.lc
        assert lc is not None
        step, wv, at = lc.step_index, lc.weight_version, len(self.log)
        batch = self._batch()
        trained = self.log.count("trainer", "train_step")
        user_batch = self._user_batch(batch)
        ok = self._drive("step", lc.step, user_batch, coro=self.alc.step(user_batch) if self.alc else None)
        self._latched(step, wv, at)
        self._after_train(batch, wv, trained, ok, inline=self.cfg.inline_validator)

    def _after_train(self, batch: list[int], wv: int, trained_before: int, ok: bool, *, inline: bool) -> None:
        if self.log.count("trainer", "train_step") > trained_before:
            self.buffer.trained_on(batch, wv)
            _count("steps_trained")
        else:
            self.buffer.give_back(batch)
        rec = self._pending_step()
        if ok and rec is not None:
            self._step_outcome(rec, inline=inline)

    @precondition(lambda self: self._can_fire("end_validation"))
    @rule()
    def end_validation(self) -> None:
        lc = self.lc
        assert lc is not None
        ok = self._drive("end_validation", lc.end_validation, coro=self.alc.end_validation() if self.alc else None)
        rec = self._pending_step()
        if ok and rec is not None:
            self._step_outcome(rec, inline=True)

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
            st.tuples(st.just("wrong_trigger"), st.sampled_from((*_ALL_TRIGGERS, "fail", "no_such_trigger"))),
            st.tuples(st.just("rollout"), st.sampled_from([1, 4])),
            st.tuples(st.just("decode"), st.sampled_from([1, 3])),
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
        elif kind == "rollout":  # your collector starts rollouts (it issues nothing while paused)
            if self.ad is not None and self.ad.rollout is not None:
                for _ in range(arg):
                    self.ad.rollout()
                _count("rollouts_started", arg)
        elif kind == "decode":  # your engine's own loop runs decode steps (none while its requests are parked)
            if self.ad is not None and self.ad.decode is not None:
                for _ in range(arg):
                    self.ad.decode()
                _count("decode_ticks", arg)
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
                if self.adopts:
                    v["build_once"].append(
                        f"event {ev.index}: engine.bring_up although spec {self.spec.name} adopts an engine up "
                        "at construction"
                    )
                elif self.builds > 1:
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
                validation_wake = name == "engine.resume" and self.spec.state(ev.state).validates
                if self.last_latched_at is not None and ev.index > self.last_latched_at and not validation_wake:
                    v["last_step"].append(
                        f"event {ev.index}: {name} in {ev.state} after the last step latched (only a "
                        "validation-only wake may follow it)"
                    )
                if self.builds == 0 and not self.adopts:
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
    @checks(LifecycleRule.PARK_NOT_DRAIN)
    def no_decode_while_parked(self) -> None:
        """Park, don't drain: no decode step runs while the state declares the requests parked, and the engine
        holds them as declared (parked in a handoff, none left parked after a resume)."""
        lc = self.lc
        if lc is None:
            return
        now = self._decode_count()
        before, self.decode_seen = self.decode_seen, now  # counted in Failed too, so no decode is blamed later
        if lc.state is S.FAILED:
            return
        decl = lc.spec.state(lc.state)
        if now is not None and before is not None and now > before and decl.requests is not RequestCondition.RUNNING:
            raise AssertionError(
                f"{now - before} decode step(s) ran in {lc.state.value}, where the spec declares requests "
                f"{decl.requests.value} (a rollout kept issuing engine work during a handoff)\n  recent calls:\n"
                + "\n".join(self.log.lines(max(0, len(self.log) - 20)))
            )
        if self.ad is not None and self.ad.request_probe is not None:
            counts = self.ad.request_probe()
            running, parked = int(getattr(counts, "running", 0)), int(getattr(counts, "parked", 0))
            if decl.requests is RequestCondition.PARKED:
                assert running == 0, f"in {lc.state.value}: {running} request(s) running, the spec declares parked"
            elif decl.requests is RequestCondition.RUNNING:
                assert parked == 0, f"in {lc.state.value}: {parked} request(s) still parked after the resume"

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


@dataclass
class RanksResult:
    """What :func:`exercise_ranks` did: the adapters of every rank driven through a short run, then the checker."""

    ranks: int
    spec: str
    steps: int
    adapter_calls: int
    checks: list[Any]  # the checker's CheckResults for the same spec and N, one per scenario of the spec
    adapters_exercised: bool = True

    @property
    def check(self) -> Any:
        """The first failing CheckResult (else the first)."""
        return next((c for c in self.checks if not c.ok), self.checks[0])

    @property
    def ok(self) -> bool:
        """True when the checker found nothing (and, if exercised, every rank's adapters ran the short run)."""
        return all(c.ok for c in self.checks)

    def report(self) -> str:
        """The summary plus the checker's report of a failing scenario."""
        return self.summary() + ("" if self.ok else "\n" + self.check.report())

    def summary(self) -> str:
        """One line; it says plainly when only the spec was checked."""
        who = (
            f"{self.ranks} ranks of your adapters ran {self.steps} steps of spec {self.spec} "
            f"({self.adapter_calls} watched calls)"
            if self.adapters_exercised
            else f"spec {self.spec} only: no adapters were exercised"
        )
        verdict = "ok" if self.ok else f"VIOLATION: {self.check.violation}"
        return f"{who}; checker over {len(self.checks)} scenario(s) of N={self.ranks}: {verdict}"


def exercise_ranks(
    factory: AdapterFactory | None,
    ranks: int,
    *,
    spec: LifecycleSpec = LIFECYCLE,
    steps: int = 4,
    timeout_s: float = 60.0,
    batch_factory: Callable[[list[int], int], Any] | None = None,
    drain_factory: Callable[..., Callable[[], object]] | None = None,
    validator: Callable[[int, int], Any] | None = None,
    validator_factory: Callable[..., Callable[[int, int], Any]] | None = None,
    checkpoint_factory: Callable[..., LatchedDecision] | None = None,
    validation_factory: Callable[..., LatchedDecision] | None = None,
    early_stop_factory: Callable[..., LatchedDecision] | None = None,
    **check_kwargs: Any,
) -> RanksResult:
    """Drive ``ranks`` sets of *your* adapters (one factory call per rank) as thread ranks meeting at a barrier
    through a short run of ``spec`` (a save, a validation, the last step), auditing each rank's calls for the
    handoff rules, then prove every interleaving of ``ranks`` ranks of the spec with the exhaustive checker.

    Your components are used as the lifecycle machine uses them: ``batch_factory(trajectories, step)`` builds
    the batch each step trains on (default: the list of trajectory weight versions), ``drain_factory(local_rank[,
    handle])`` the drain (default: the shipped DeviceDrain of device ``rank``), and the decision and validator
    factories take the rank's :class:`KitHandle`. A factory that raises, an adapter that fails, or a handoff
    violation raises AssertionError naming the rank. With ``factory=None`` only the spec is checked, and the
    result says so (``adapters_exercised=False``).
    """
    from colo_fsm.guards.barrier import ThreadBarrier
    from colo_fsm.testing.checker import check_all

    result = check_all([ranks], spec=spec, **check_kwargs)
    if factory is None:
        return RanksResult(ranks, spec.name, 0, 0, result, adapters_exercised=False)
    shared = threading.Barrier(ranks)
    errors: dict[int, BaseException] = {}
    calls = [0] * ranks
    decided = {f for a in spec.actions for f in a.decides}
    val_at_end = last_step_validates(spec)

    def run_rank(rank: int) -> None:
        runner = LoopRunner()
        try:
            handle = KitHandle(spec, rank=rank, local_rank=rank)
            try:
                ad = as_adapters(_call_factory(factory, handle))
            except Exception as exc:
                raise AssertionError(f"rank {rank}: the adapter factory raised {type(exc).__name__}: {exc}") from exc
            try:
                user = build_components(
                    handle,
                    checkpoint_factory=checkpoint_factory,
                    validation_factory=validation_factory,
                    early_stop_factory=early_stop_factory,
                    drain_factory=drain_factory,
                    validator_factory=validator_factory,
                )
            except Exception as exc:
                raise AssertionError(f"rank {rank}: a component factory raised {type(exc).__name__}: {exc}") from exc
            conditions = Conditions(engine=spec.state(spec.initial).engine)
            holder: list[Lifecycle] = []
            log = EventLog(lambda: holder[0].state.value if holder else spec.initial.value, conditions)
            faults = FaultSwitch()
            collector = WatchedCollector(ad.collector, log, faults, runner) if ad.collector is not None else None
            drain: Callable[[], object] = (
                _watched_drain(user["drain"], rank, log, faults)
                if "drain" in user
                else DeviceDrain(rank, synchronize=watched_synchronize(log, faults))
            )
            early_stop = None
            if Fact.STOP_EARLY in decided:
                early_stop = user.get("early_stop") or LatchedDecision("early_stop", lambda _s: False)
            lc = Lifecycle(
                WatchedEngine(ad.engine, log, faults, runner),
                WatchedTrainer(ad.trainer, log, faults, runner),
                collector,
                config=LifecycleConfig(
                    num_steps=steps,
                    rank=rank,
                    world_size=ranks,
                    val_at_start=Fact.VALIDATE_AT_START in decided,
                    val_at_end=val_at_end,
                ),
                drain=drain,
                barrier=WatchedBarrier(ThreadBarrier(shared, rank, timeout_s=timeout_s), log, faults, rank=rank),
                checkpoint=user.get("checkpoint") or CheckpointDecision(2),
                validation=user.get("validation") or ValidationDecision(2),
                validator=user.get("validator", validator) or (lambda _s, _w: {"accuracy": 1.0}),
                early_stop=early_stop,
                spec=spec,
            )
            holder.append(lc)
            handle.lifecycle = lc
            audit = HandoffAudit(spec, rank)
            lc.start()
            while not lc.finished:
                if ad.rollout is not None:
                    ad.rollout()
                trajectories = [lc.weight_version]
                lc.step(batch_factory(trajectories, lc.step_index) if batch_factory is not None else trajectories)
                if spec.state(lc.state).validates:
                    lc.end_validation()
            lc.stop()
            bad = audit.feed(log.events)
            if bad:
                raise AssertionError(f"rank {rank}: " + "; ".join(bad[:3]))
            calls[rank] = len(log)
            if ad.close is not None:
                ad.close()
        except BaseException as exc:  # reported below, per rank
            errors[rank] = exc
            shared.abort()
        finally:
            runner.close()

    threads = [threading.Thread(target=run_rank, args=(r,), name=f"colo-fsm-rank-{r}") for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 4)
    if errors:
        first = min(errors)
        raise AssertionError(
            f"{len(errors)} of {ranks} ranks failed with your adapters; rank {first}: {errors[first]}"
        ) from errors[first]
    return RanksResult(ranks, spec.name, steps, sum(calls), result)


def stats_snapshot() -> dict[str, int]:
    """A copy of :data:`STATS`."""
    with _STATS_LOCK:
        return dict(STATS)


__all__ = [
    "FAULT_PATIENCE",
    "STATS",
    "AdapterFactory",
    "Adapters",
    "KitHandle",
    "LifecycleMachine",
    "RanksResult",
    "RunConfig",
    "StepRecord",
    "as_adapters",
    "build_components",
    "callable_targets",
    "check_lifecycle",
    "exercise_ranks",
    "lifecycle_machine",
    "lifecycle_test_case",
    "recording_fakes",
    "run_configs",
    "spec_fakes",
    "stats_snapshot",
]
