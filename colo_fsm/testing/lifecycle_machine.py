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
import contextlib
import dataclasses
import unittest
from collections.abc import Callable
from typing import Any, ClassVar

from hypothesis import note
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from colo_fsm.errors import GuardRejected, InvalidTransition, LifecycleError
from colo_fsm.guards.barrier import SoloBarrier
from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.guards.drain import DeviceDrain
from colo_fsm.machine.aio import AsyncLifecycle
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.spec import LIFECYCLE, CollectorCondition, EngineCondition, Fact, LifecycleSpec, State
from colo_fsm.testing.components import (
    AdapterFactory,
    Adapters,
    KitHandle,
    as_adapters,
    build_components,
    call_factory,
    recording_fakes,
    spec_fakes,
    watched_drain,
)
from colo_fsm.testing.effects import Cause, Effects
from colo_fsm.testing.fakes import FakeClock, FakeReplayBuffer, FakeRequestSource
from colo_fsm.testing.fault_arming import FaultArming
from colo_fsm.testing.invariants import LifecycleInvariants
from colo_fsm.testing.oracle import StepOracle
from colo_fsm.testing.profiles import lifecycle_settings
from colo_fsm.testing.programs import (
    ALL_TRIGGERS,
    DIRECTED_OPTIONS,
    FAULT_DRAWS,
    FAULT_PATIENCE,
    FIRST_FAULTS,
    RunConfig,
    StepRecord,
    callable_targets,
    condition_name,
    fit_config,
    run_configs,
)
from colo_fsm.testing.ranks import RanksResult, exercise_ranks
from colo_fsm.testing.report import ProgramLogs, recent_lines, run_machine, where_raised
from colo_fsm.testing.spec_gate import check_spec_once
from colo_fsm.testing.stats import STATS, count, stats_snapshot
from colo_fsm.testing.traffic import KitTraffic
from colo_fsm.testing.watch import (
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

CALLS_PER_LIFECYCLE_CALL = 1000
"""Adapter calls one lifecycle call may make (a step makes a few dozen) before the kit refuses the next: a spec
whose automatic transitions never come to rest fails the program instead of looping for ever."""


# ---------------------------------------------------------------------------------------------- machine
class LifecycleMachine(FaultArming, KitTraffic, StepOracle, LifecycleInvariants, RuleBasedStateMachine):
    """Drives one :class:`Lifecycle` over your adapters and checks the lifecycle rules after every step.

    Configure by subclassing (or through :func:`lifecycle_test_case`):

    * ``adapters_factory``: zero-argument callable returning :class:`Adapters` or a triple (default: fakes);
    * ``spec`` / ``check_spec``: the lifecycle to run (a mutated one with ``check_spec=False`` in mutation tests);
    * ``lifecycle_class``, ``drain_class``, ``checkpoint_class``, ``cap_class``: components (mutants swap them);
    * ``local_rank``: the device the drain must synchronize (non-zero, so a drain of device 0 shows);
    * ``inject_faults``: whether rules may make adapter calls fail;
    * ``first_fault``: a call (``("trainer", "restore_buffers")``) every program arms first, in place of a drawn
      one (a directed run that makes sure that call's failure path is exercised);
    * ``fixed_options``: :class:`RunConfig` fields every program takes as given instead of drawn (e.g.
      ``{"validate_every": 1}``: every step validates, so the paths after a validation come in every program);
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
    first_fault: ClassVar[tuple[str, str] | None] = None
    fixed_options: ClassVar[dict[str, Any]] = {}
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
        self.violations = collections.defaultdict(list)
        self.logs: ProgramLogs | None = None
        count("programs")

    # ------------------------------------------------------------------ setup / teardown
    @initialize(cfg=run_configs(), autostart=st.integers(0, 4), first_fault=st.sampled_from(FIRST_FAULTS))
    def setup(self, cfg: RunConfig, autostart: int, first_fault: tuple[str, str] | None = None) -> None:
        """Build adapters, proxies and the lifecycle for one drawn configuration; usually start it, too.

        ``first_fault`` (see :data:`FIRST_FAULTS`) is armed before anything runs and waits for its call.
        """
        cls = type(self)
        spec = cls.spec
        if cls.check_spec:
            check_spec_once(spec)  # once per spec and process; every Lifecycle below then skips it
        self.logs = ProgramLogs()
        decided = {f for a in spec.actions for f in a.decides}
        if cls.first_fault is not None:  # a directed run: the drawn options make its call at every step they can
            cfg = dataclasses.replace(cfg, **DIRECTED_OPTIONS.get(cls.first_fault, {}))
        if cls.fixed_options:
            cfg = dataclasses.replace(cfg, **cls.fixed_options)
        cfg = fit_config(cfg, spec, user_validation=cls.validation_factory is not None)
        self.cfg = cfg
        self.handle = KitHandle(spec, local_rank=cls.local_rank)
        self.ad = as_adapters(call_factory(cls.adapters_factory, self.handle))
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
        self.log.names = {"engine": self.engine.adapter_name, "trainer": self.trainer.adapter_name}
        if self.collector is not None:
            self.log.names["collector"] = self.collector.adapter_name
        self.effects = Effects.watch(
            self.log,
            spec.state(spec.initial).engine,
            self.ad.engine,
            names={
                "engine": self.engine.adapter_name,
                "suspend": self.engine.method_name("suspend"),
                "shutdown": self.engine.method_name("shutdown"),
                "decode_step": self.engine.method_name("decode_step"),
                "train_step": self.trainer.method_name("train_step"),
            },
            decode_probe=self.ad.decode_probe,
            tick=self.ad.decode,
        )
        self.trainer.during_train_step = self._requests_during_training
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
            drain = watched_drain(user["drain"], cls.local_rank, self.log, self.faults)
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
            check_spec=False,  # the gate above checked it (a mutant's spec is not checked at all)
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
        first_fault = cls.first_fault or first_fault
        if first_fault is not None and cls.inject_faults:
            self._arm(first_fault)
        if autostart:  # most programs start at once; the others may see faults and triggers before the build
            self.start()

    def teardown(self) -> None:
        if self.lc is not None:
            records = self.lc.trace.records
            count("transitions", len(records))
            for dest in {r.dest for r in records}:
                count(f"reached:{dest}")
            for component, method in self.faults.fired:
                count(f"fired:{component}.{method}")
        try:
            if self.alc is not None:
                self.alc._executor.shutdown(wait=True)
            if self.lc is not None:
                self.lc.close()
                requests = self.effects.requests
                released = requests.close(self._shutdown_engine)
                count("kit_requests", len(requests.requests))
                count("kit_request_waits", requests.waits)
                count("kit_request_wait_ms", round(requests.waited_s * 1000))
                if released:
                    count("kit_requests_released_at_end", released)
            if self.ad is not None and self.ad.close is not None:
                self.ad.close()
        finally:
            self.runner.close()
            if self.logs is not None:
                self.logs.close()
                lines = self.logs.tail()
                if lines:
                    with contextlib.suppress(InvalidArgument):  # a program driven by hand, outside hypothesis
                        note("logs of this program:\n" + "\n".join(f"    {line}" for line in lines))

    # ------------------------------------------------------------------ helpers
    def _state_name(self) -> str:
        return self.lc.state.value if self.lc is not None else self.spec.initial.value

    def _probe(self) -> tuple[str | None, str | None]:
        ad = self.ad
        if ad is None:
            return None, None
        return (
            condition_name(ad.engine_probe()) if ad.engine_probe else None,
            condition_name(ad.collector_probe()) if ad.collector_probe else None,
        )

    def _at(self, *states: State) -> bool:
        return self.lc is not None and self.lc.state in states

    def _ended(self) -> bool:
        """The run is over (a terminal state): every rule may be drawn, each checking its call's refusal, so a
        program that stopped early never runs out of rules (hypothesis would discard it half-run)."""
        return self.lc is not None and self.lc.spec.state(self.lc.state).terminal

    def _can_fire(self, trigger: str) -> bool:
        """Whether ``trigger`` leaves the current state in the spec (its guards aside)."""
        return self.lc is not None and self.lc.state is not S.FAILED and trigger in self.lc.spec.triggers(self.lc.state)

    def _drive(self, label: str, fn: Callable[..., Any], *args: Any, coro: Any = None) -> bool:
        """Run one lifecycle call; a failure is fine only if an injected fault fired during it."""
        assert self.lc is not None
        fired = len(self.faults.fired)
        count("lifecycle_calls")
        self.log.call_budget = self.log.calls() + CALLS_PER_LIFECYCLE_CALL
        try:
            if coro is not None:
                self.runner(coro)
            else:
                fn(*args)
        except LifecycleError as exc:
            if len(self.faults.fired) == fired:
                where = where_raised(exc)
                raise AssertionError(
                    f"{label}: the lifecycle failed with no fault injected: {exc}"
                    + (f"\n  raised at {where}" if where else "")
                    + "\n  recent calls:\n"
                    + "\n".join(recent_lines(self.log))
                ) from exc
            self._check_failure(label, exc)
            return False
        except InjectedFault as exc:  # escaped the lifecycle untyped
            raise AssertionError(f"{label}: an adapter fault escaped without a typed lifecycle error: {exc!r}") from exc
        finally:
            self.log.call_budget = None
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
        count("failures_after_fault")
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

    # ------------------------------------------------------------------ rules: the training loop
    @precondition(lambda self: self._at(S.CREATED) or self._ended())
    @rule()
    def start(self) -> None:
        lc = self.lc
        assert lc is not None
        if self._ended():
            return self._wrong_trigger("start")
        self._drive("start", lc.start, coro=self.alc.start() if self.alc else None)

    @precondition(lambda self: self._can_fire("begin_step") or self._ended())
    @rule()
    def begin_step(self) -> None:
        lc = self.lc
        assert lc is not None
        if self._ended():
            return self._wrong_trigger("begin_step")
        step, wv, at = lc.step_index, lc.weight_version, len(self.log)
        self._drive("begin_step", lc.begin_step, coro=self.alc.fire("begin_step") if self.alc else None)
        self._latched(step, wv, at)

    @precondition(lambda self: self._can_fire("train") or self._ended())
    @rule()
    def train(self) -> None:
        """``Lifecycle.train`` (a server request arrives while the trainer runs)."""
        lc = self.lc
        assert lc is not None
        if self._ended():
            return self._wrong_trigger("train")
        batch, wv = self._batch(), lc.weight_version
        trained = self.log.count("trainer", "train_step")
        ok = self._drive("train", lc.train, self._user_batch(batch))
        self._after_train(batch, wv, trained, ok, inline=False)

    @precondition(lambda self: self._can_fire("begin_step") or self._ended())
    @rule()
    def whole_step(self) -> None:
        """``Lifecycle.step``: handoff, train, save, (inline validation), handoff back (a server request arrives
        while the trainer runs)."""
        lc = self.lc
        assert lc is not None
        if self._ended():
            return self._wrong_trigger("begin_step")
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
            count("steps_trained")
        else:
            self.buffer.give_back(batch)
        rec = self._pending_step()
        if ok and rec is not None:
            self._step_outcome(rec, inline=inline)

    @precondition(lambda self: self._can_fire("end_validation") or self._ended())
    @rule()
    def end_validation(self) -> None:
        lc = self.lc
        assert lc is not None
        if self._ended():
            return self._wrong_trigger("end_validation")
        ok = self._drive("end_validation", lc.end_validation, coro=self.alc.end_validation() if self.alc else None)
        rec = self._pending_step()
        if ok and rec is not None:
            self._step_outcome(rec, inline=True)

    @precondition(lambda self: (self.lc is not None and self.lc.can("stop")) or self._ended())
    @rule(now=st.integers(0, 2))
    def stop(self, now: int) -> None:
        """Stop the run (a one-in-three draw, so programs get deep before they stop)."""
        lc = self.lc
        assert lc is not None
        if now:
            return None
        if self._ended():
            return self._wrong_trigger("stop")
        self._drive("stop", lc.stop, coro=self.alc.stop() if self.alc else None)

    # ------------------------------------------------------------------ rules: the world around it
    @precondition(lambda self: self.lc is not None)
    @rule(
        event=st.one_of(
            st.tuples(st.just("time"), st.sampled_from([1.0, 2.0, 7.0, 30.0])),
            st.tuples(st.just("request"), st.sampled_from([1, 4])),
            st.tuples(st.just("rollouts_admitted"), st.sampled_from([1, 7, 64])),
            st.tuples(st.just("rollouts_finish"), st.sampled_from([1, 7, 64])),
            st.tuples(st.just("fault"), st.sampled_from(FAULT_DRAWS)),
            st.tuples(st.just("wrong_trigger"), st.sampled_from((*ALL_TRIGGERS, "fail", "no_such_trigger"))),
            st.tuples(st.just("rollout"), st.sampled_from([1, 4])),
            st.tuples(st.just("decode"), st.sampled_from([1, 3])),
        )
    )
    def disturb(self, event: tuple[str, Any]) -> None:
        """Something happens around the machine. One rule for all of them, so the loop's own rules stay frequent.

        ``time``: the wall clock moves (the "must save by" deadline may pass); ``request``: an external agent calls
        the server (served now if the engine is awake, else on resume), and the kit sends your engine a request of
        that many tokens (an engine with a loop of its own gets a short wait to serve it: none may come while the
        lifecycle holds it suspended); ``rollouts_admitted``: the running
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
            count("requests")
            requests = self.effects.requests
            with self._activity(Cause.SERVER):
                sent = requests.send(Cause.SERVER, int(arg))
                if sent is not None and not requests.step_driven and sent.window.silent:
                    requests.settle(requests.wait_s())
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
                who = f"{self.collector.adapter_name}.start_rollout" if self.collector is not None else "your rollout"
                with self._activity(Cause.ROLLOUT), self.effects.requests.delivering(who):
                    for _ in range(arg):
                        self.ad.rollout()
                count("rollouts_started", arg)
        elif kind == "decode":  # your engine's own loop runs decode steps (none while its requests are parked)
            if self.ad is not None and self.ad.decode is not None:
                with self._activity(Cause.ROLLOUT):
                    for _ in range(arg):
                        self.effects.requests.tick()
                count("decode_ticks", arg)
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
        before = (lc.state, len(lc.trace), self.log.calls(), lc.weight_version, dict(lc.facts), lc.step_index)
        try:
            lc.fire(trigger)
        except (InvalidTransition, GuardRejected) as exc:
            assert exc.state == before[0].value and trigger in str(exc), f"error must name state and trigger: {exc}"
        else:
            raise AssertionError(f"trigger {trigger!r} from {before[0].value} was accepted")
        after = (lc.state, len(lc.trace), self.log.calls(), lc.weight_version, dict(lc.facts), lc.step_index)
        assert after == before, f"a refused trigger {trigger!r} changed the machine: {before} -> {after}"
        count("wrong_triggers")


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

    class LifecycleTestCase(unittest.TestCase):
        settings = lifecycle_settings(profile)

        def runTest(self) -> None:
            __tracebackhide__ = True
            run_machine(machine, self.settings)

    LifecycleTestCase.__name__ = LifecycleTestCase.__qualname__ = f"{machine.__name__}.TestCase"
    return LifecycleTestCase


def check_lifecycle(
    factory: AdapterFactory | None = None,
    *,
    settings: Settings | None = None,
    profile: str | None = None,
    base: type[LifecycleMachine] = LifecycleMachine,
    **attrs: Any,
) -> None:
    """Run the lifecycle machine now (inside any test): the spec is validated and model-checked first (a broken
    one raises :class:`~colo_fsm.errors.SpecError` in seconds), then the programs run quietly; a failing one
    raises :class:`~colo_fsm.errors.LifecycleViolation`, a short bug report with the shrunk program."""
    __tracebackhide__ = True
    machine = lifecycle_machine(factory, base=base, **attrs)
    run_machine(machine, settings or lifecycle_settings(profile))


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
