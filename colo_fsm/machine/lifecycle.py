"""The runtime lifecycle machine, built from the declared spec on ``transitions``.

One :class:`Lifecycle` per rank in SPMD runs (every rank runs the loop, e.g. under torchrun), or one in the
driver of a single-controller run whose adapters fan out to workers. It is synchronous and thread-safe; an
asyncio loop uses :class:`colo_fsm.machine.aio.AsyncLifecycle`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transitions import Machine, MachineError

from colo_fsm.adapters.protocols import Collector, GenerationEngine, StepResult, Trainer, takes_weight_version
from colo_fsm.errors import (
    ActionFailed,
    ConfigError,
    EngineStateMismatch,
    GuardRejected,
    HandoffDivergence,
    InvalidTransition,
    LifecycleError,
    ModelModeError,
    UnsupportedEngine,
)
from colo_fsm.guards.barrier import Barrier, SoloBarrier
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.guards.drain import default_drain
from colo_fsm.guards.engine_state import check_engine_state, engine_state_of, start_hint
from colo_fsm.guards.handoff import HandoffLedger
from colo_fsm.log import get_logger, heartbeat
from colo_fsm.log import set_context as _log_context
from colo_fsm.machine.config import LifecycleConfig, LifecycleStatus, check_arguments, has_methods
from colo_fsm.machine.options import checkpointing_enabled, refuse_ignored_options
from colo_fsm.machine.roles import ActionRoles
from colo_fsm.machine.trace import Trace, TraceRecord
from colo_fsm.states.spec import (
    LIFECYCLE,
    ActionSpec,
    CollectorCondition,
    EngineCondition,
    Fact,
    LifecycleSpec,
    Role,
    State,
    TransitionSpec,
)
from colo_fsm.states.validate import validate_spec

log = get_logger(__name__)
_STATE_BY_NAME = {s.value: s for s in State}
_NAME = {s: s.value for s in State}  # a member's value by plain dict lookup (``.value`` is a descriptor call)


@dataclass
class _Model:
    """The object ``transitions`` keeps the state on."""

    state: str = State.CREATED.value


class Lifecycle(ActionRoles):
    """The colocation lifecycle of one rank (or of a single controller), driving engine, trainer, collector.

    Typical loop::

        lc = Lifecycle(engine, trainer, collector, config=LifecycleConfig(num_steps=100))
        lc.start()                       # engine built once; collection starts
        while not lc.finished:
            batch = buffer.sample(...)   # while Generating
            lc.step(batch)               # drain, barrier, train, [save], [validate], drain, barrier, resume
        lc.stop()                        # teardown happens here only

    Triggers can also be fired one by one (:meth:`fire`); an invalid one raises
    :class:`~colo_fsm.errors.InvalidTransition`. An action that raises moves the machine to Failed and the
    caller gets :class:`~colo_fsm.errors.ActionFailed` with the cause, state, rank and weight version.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        trainer: Trainer,
        collector: Collector | None = None,
        *,
        config: LifecycleConfig | None = None,
        drain: Callable[[], object] | None = None,
        barrier: Barrier | None = None,
        checkpoint: LatchedDecision | None = None,
        validation: LatchedDecision | None = None,
        validator: Callable[[int, int], Mapping[str, float] | None] | None = None,
        early_stop: LatchedDecision | None = None,
        checkpoint_extra: Callable[[], Mapping[str, Any]] | None = None,
        server_urls_sink: Callable[[list[str]], None] | None = None,
        spec: LifecycleSpec = LIFECYCLE,
        check_spec: bool = True,
    ) -> None:
        check_arguments(
            engine,
            trainer,
            collector,
            config,
            drain,
            barrier,
            checkpoint,
            validation,
            spec,
            validator=validator,
            checkpoint_extra=checkpoint_extra,
            server_urls_sink=server_urls_sink,
        )
        self.config = config or LifecycleConfig()
        if self.config.async_training and not getattr(engine, "reads_weights_in_place", False):
            raise UnsupportedEngine(
                f"{type(engine).__name__} does not read the training weights in place "
                "(reads_weights_in_place is False): with a colocated engine that refits weights across worlds, "
                "asynchronous training would generate from weights that are being overwritten. Use an engine "
                "that reads weights in place (the megatron-core adapter), or run synchronously with "
                "LifecycleConfig(async_training=False) and refit weights in your trainer's offload_buffers()."
            )
        if barrier is None and self.config.world_size > 1:
            raise ConfigError("barrier", None, f"a Barrier over the {self.config.world_size} ranks")
        if early_stop is not None and not has_methods(early_stop, ("decide",)):
            raise ConfigError("early_stop", early_stop, "a LatchedDecision (decide(step) -> bool) or None")
        if check_spec:  # False only for mutation testing: a spec the validator rejects, caught at run time
            validate_spec(spec)
        refuse_ignored_options(
            spec,
            self.config,
            trainer=trainer,
            checkpoint=checkpoint,
            validation=validation,
            validator=validator,
            early_stop=early_stop,
            checkpoint_extra=checkpoint_extra,
            server_urls_sink=server_urls_sink,
            engine=engine,
            drain=drain,
            barrier=barrier,
            walk_spec=check_spec,
        )
        if spec.engine_up_at_construction and engine_state_of(engine) is None:
            raise ConfigError(
                "engine.condition",
                getattr(engine, "condition", None),
                f"an engine that reports its condition (a condition attribute 'awake', 'suspended', ..., or "
                f"engine_state() -> EngineStateReport): spec {spec.name} declares the engine up at construction "
                f"({spec.initial.value}: engine awake) and start adopts it only once it reports awake",
            )
        self.spec = spec
        # the spec's per-state lookups, keyed by member (the spec's own methods convert their argument first):
        # read on every transition
        self._triggers_of = {s: spec.triggers(s) for s in State}
        self._automatic = {s: tuple(t for t in spec.outgoing(s) if t.automatic) for s in State}
        self._state_specs = {s.state: s for s in spec.states}
        self.engine = engine
        self.trainer = trainer
        self.collector = collector
        self.rank = self.config.rank
        self._drain = drain if drain is not None else default_drain()
        self._barrier = barrier or SoloBarrier()
        self.checkpoint_decision = checkpoint or CheckpointDecision()
        if isinstance(checkpoint, CheckpointDecision):
            checkpoint.bind_num_steps(self.config.num_steps)
        save_on_stop = self.config.save_on_early_stop
        self.saves_on_early_stop = checkpointing_enabled(checkpoint) if save_on_stop is None else save_on_stop
        """Whether an early stop saves the step it ends (it checkpoints, or ``save_on_early_stop=True``)."""
        self.validation_decision = validation or ValidationDecision()
        self._validator = validator
        self.early_stop = early_stop
        self._collector_takes_version = collector is not None and takes_weight_version(collector.resume)
        self._latched_step: int | None = None
        self._validated_this_step = False
        self._entering: State = spec.initial
        self._checkpoint_extra = checkpoint_extra
        self._server_urls_sink = server_urls_sink
        self.step_index = self.config.start_step
        self.weight_version = self.config.start_weight_version
        self.engine_condition = spec.state(spec.initial).engine
        self.collector_condition = CollectorCondition.PAUSED
        self.request_condition = spec.state(spec.initial).requests
        self.ledger = HandoffLedger()
        self.facts: dict[Fact, bool] = dict.fromkeys(Fact, False)
        self.dp_openai_server_base_urls: list[str] = []
        self.failure: LifecycleError | None = None
        self.last_result: StepResult | None = None
        self.last_validation: Mapping[str, float] | None = None
        self.trace = Trace(self.config.trace_path)
        self._lock = threading.RLock()
        self._seq = 0
        self._batch: Any = None
        self._unused: list[Any] = []  # stop(unused=...): the batch handed back to the collector
        self._current_action: str | None = None
        self._action_times: dict[str, float] = {}
        self._action_t0 = 0.0  # time.monotonic() when the running action started
        self._progress_reported = 0.0
        heartbeat.watch(self)
        self._actions = self._bind_actions()
        self._model = _Model(spec.initial.value)
        self._machine = Machine(
            model=self._model,
            states=[s.state.value for s in spec.states],
            initial=spec.initial.value,
            auto_transitions=False,
            ignore_invalid_triggers=False,
            send_event=False,
        )
        for t in spec.transitions:
            self._machine.add_transition(
                t.trigger,
                t.source.value,
                t.dest.value,
                conditions=[self._reader(f) for f in t.when],
                unless=[self._reader(f) for f in t.unless],
                after=self._runner(t),
            )
        self._machine.add_transition(spec.fail_trigger, [s.value for s in spec.failable()], spec.failed.value)

    # ------------------------------------------------------------------ queries
    @property
    def state(self) -> State:
        """The current state."""
        return _STATE_BY_NAME[self._model.state]

    @property
    def finished(self) -> bool:
        """True once the last step is done (Done) or the machine stopped or failed."""
        return self.spec.state(self.state).final

    def can(self, trigger: str) -> bool:
        """Whether ``trigger`` would be taken now (pure: evaluates guards only)."""
        return self.spec.select(self.state, trigger, self.facts) is not None

    def status(self) -> LifecycleStatus:
        """A snapshot for displays, health endpoints and checkpoints."""
        return LifecycleStatus(
            state=self.state.value,
            rank=self.rank,
            step=self.step_index,
            weight_version=self.weight_version,
            engine=self.engine_condition.value,
            collector=self.collector_condition.value,
            facts={k.value: v for k, v in self.facts.items()},
            failure=str(self.failure) if self.failure else None,
        )

    # ------------------------------------------------------------------ driving
    def fire(self, trigger: str) -> State:
        """Fire one user trigger, then every automatic transition it enables; return the resulting state."""
        with self._lock:
            self._fire(trigger)
            self._run_automatic()
            return self.state

    def start(self) -> State:
        """Build the engine once and start collection (Created -> Generating); with ``val_at_start`` and a
        ``validator``, the validation at start runs here too."""
        with self._lock:
            if self.state is self.spec.initial:
                self._check_engine_state("at start")  # before anything runs: nothing to undo when refused
            self.fire("start")
            self._inline_validation()
            return self.state

    def begin_step(self) -> State:
        """Hand off to training: latch this step's decisions, pause, suspend, drain own device, barrier."""
        return self.fire("begin_step")

    def train(self, batch: Any) -> State:
        """Run the training step on ``batch``, then save / validate / wake as latched."""
        with self._lock:
            self._batch = batch
            try:
                return self.fire("train")
            finally:
                self._batch = None

    def end_validation(self) -> State:
        """Validation is finished: resume collection (Validating -> Generating)."""
        return self.fire("end_validation")

    def step(self, batch: Any) -> StepResult:
        """One whole training step from Generating: handoff, train, save, validate, handoff back.

        With a ``validator``, validation runs inside the step (the engine awake, collector paused) and the
        machine returns to Generating; without one, a validating step stays in Validating until
        :meth:`end_validation`.
        """
        with self._lock:
            self.begin_step()
            self.train(batch)
            self._inline_validation()
            assert self.last_result is not None
            return self.last_result

    def _inline_validation(self) -> None:
        """With a ``validator``: validate in every validation-only state the run rests in, then move on."""
        while self._validator is not None and self.spec.state(self.state).validates and self.can("end_validation"):
            self._validate()
            self.end_validation()

    def stop(self, unused: Sequence[Any] | None = None) -> State:
        """End the run from any state and tear down (the only place teardown happens), ending in Stopped.

        A loop that raised mid-step stops here too: the step in progress is abandoned, not trained. The collector
        takes back the prompts of its rollouts in flight (``take_back``; the teardown aborts them) and ``unused``,
        the batch the loop drew and did not train, so that a restart issues them again.
        """
        with self._lock:
            self._unused = self._check_unused(unused)
            try:
                return self.fire("stop")
            finally:
                self._unused = []
                if self.spec.state(self.state).terminal:
                    self.trace.close()

    def _check_unused(self, unused: Sequence[Any] | None) -> list[Any]:
        """``stop``'s ``unused`` batch as a list, refused before anything runs when nothing would take it back."""
        if unused is None:
            return []
        if isinstance(unused, str | bytes | Mapping) or not isinstance(unused, Iterable):
            raise ConfigError("unused", unused, "a sequence (the batch the loop drew and did not train) or None")
        items = list(unused)
        take_back = getattr(self.collector, "take_back", None) if self.collector is not None else None
        t = self.spec.select(self.state, "stop", self.facts)
        if items and not callable(take_back):
            raise ConfigError(
                "unused",
                f"{len(items)} item(s)",
                f"a collector with take_back(unused) to give them back to ({type(self.collector).__name__} has "
                "none): keep the batch yourself and call stop() without it",
            )
        if items and t is not None and not any(self.spec.action(a).role is Role.RETURN_PROMPTS for a in t.actions):
            raise ConfigError(
                "unused",
                f"{len(items)} item(s)",
                f"a stop whose actions return them (stop from {self.state.value} has none)",
            )
        return items

    def close(self) -> None:
        """Close the trace file."""
        self.trace.close()

    # ------------------------------------------------------------------ internals: transitions
    def _reader(self, fact: Fact) -> Callable[..., bool]:
        facts = self.facts
        return lambda *_a, **_k: facts[fact]

    def _fire(self, trigger: str) -> None:
        state = self.state
        if trigger not in self._triggers_of[state]:
            raise InvalidTransition(
                trigger,
                state.value,
                allowed=self.spec.triggers(state),
                rank=self.rank,
                weight_version=self.weight_version,
            )
        self._pending = (trigger, time.time(), state)
        try:
            moved = self._model.trigger(trigger)  # type: ignore[attr-defined]
        except _ActionError as err:
            self._fail(err)
            raise self.failure from err.cause  # type: ignore[misc]
        except MachineError as exc:  # defensive: spec and machine disagree
            raise InvalidTransition(trigger, state.value, rank=self.rank, weight_version=self.weight_version) from exc
        if not moved:
            failed = tuple(
                t.guard_text() for t in self.spec.outgoing(state) if t.trigger == trigger and not t.enabled(self.facts)
            )
            raise GuardRejected(trigger, state.value, failed=failed, rank=self.rank, weight_version=self.weight_version)

    def _run_automatic(self) -> None:
        facts = self.facts
        while True:
            state = self.state
            outgoing = self._automatic[state]
            auto = next((t for t in outgoing if _holds(t, facts)), None)  # the first enabled, in declaration order
            if auto is not None:
                self._fire(auto.trigger)
                continue
            if outgoing and not self._state_specs[state].resting:
                # A transient state with no way out: the lifecycle is stuck (e.g. a step that never bumped the
                # weight version). Fail loudly instead of leaving the run hanging in a half-done handoff.
                err = GuardRejected(
                    outgoing[0].trigger,
                    state.value,
                    failed=tuple(t.guard_text() for t in outgoing),
                    rank=self.rank,
                    weight_version=self.weight_version,
                )
                self._fail(_ActionError(f"guard:{outgoing[0].trigger}", outgoing[0].trigger, err))
                raise err
            return

    def _runner(self, t: TransitionSpec) -> Callable[..., None]:
        dest, dest_name, names = t.dest, _NAME[t.dest], t.actions

        def run(*_a: Any, **_k: Any) -> None:
            trigger, t_start, source = self._pending
            t_enter = time.time()
            times: dict[str, float] = {}
            self._action_times = times
            ok, error = True, None
            self._entering = dest
            if self._state_specs[source].validates and dest is not source:
                self._validated_this_step = True
            try:
                _log_context(rank=self.rank, state=dest_name, weight_version=self.weight_version, step=self.step_index)
                for name in names:
                    self._current_action = name
                    self._action_t0 = time.monotonic()
                    a0 = time.perf_counter()
                    try:
                        self._actions[name]()
                    except Exception as exc:
                        raise _ActionError(name, trigger, exc) from exc
                    finally:
                        times[name] = times.get(name, 0.0) + time.perf_counter() - a0
                self._current_action = None
            except _ActionError as err:
                ok, error = False, f"{err.action}: {type(err.cause).__name__}: {err.cause}"
                raise
            finally:
                self._record(trigger, source, dest, t_start, t_enter, ok, error)
            if log.isEnabledFor(logging.INFO):  # its arguments are not built for nothing
                self._log(
                    logging.INFO,
                    "%s -[%s]-> %s (%.1f ms)",
                    _NAME[source],
                    trigger,
                    dest_name,
                    (time.time() - t_start) * 1e3,
                )

        return run

    def _record(
        self, trigger: str, source: State, dest: State, t_start: float, t_enter: float, ok: bool, error: str | None
    ) -> None:
        self._seq += 1
        self.trace.append(  # positional, in field order: keyword arguments cost a dict per record
            TraceRecord(
                self._seq,
                self.rank,
                trigger,
                _NAME[source],
                _NAME[dest],
                self.step_index,
                self.weight_version,
                t_start,
                t_enter,
                time.time(),
                ok,
                error,
                self._action_times,  # this transition's own dict (each transition starts a new one)
                self._native_engine_state(),
            )
        )

    def _log_extra(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "rank": self.rank,
            "weight_version": self.weight_version,
            "step": self.step_index,
        }

    def _log(self, level: int, msg: str, *args: Any, exc_info: bool = False) -> None:
        """Every lifecycle line names rank, state and weight version (also as ``extra`` fields)."""
        if log.isEnabledFor(level):
            extra = self._log_extra()
            log.log(level, msg, *args, extra=extra, exc_info=exc_info)

    def _report_progress(self, now: float) -> None:
        """Called by the heartbeat thread: a line while one action runs longer than ``progress_interval_s``."""
        action = self._current_action
        if action is None:
            return
        running = now - self._action_t0
        interval = self.config.progress_interval_s
        if running >= interval and now - self._progress_reported >= interval:
            self._progress_reported = now
            self._log(logging.INFO, "still in %s after %.0f s", action, running)

    def _fail(self, err: _ActionError) -> None:
        state = self.state
        if isinstance(err.cause, GuardRejected | HandoffDivergence | ModelModeError | EngineStateMismatch):
            self.failure = err.cause
        else:
            self.failure = ActionFailed(
                err.action,
                err.trigger,
                err.cause,
                state=state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        t0 = time.time()
        if state in self.spec.failable():
            self._model.trigger(self.spec.fail_trigger)  # type: ignore[attr-defined]
        else:  # an action on the way into a terminal state (teardown) raised: no declared edge, still Failed
            self._machine.set_state(self.spec.failed.value, model=self._model)
        self._quiesce_after_failure()
        self._seq += 1
        self.trace.append(
            TraceRecord(
                seq=self._seq,
                rank=self.rank,
                trigger=self.spec.fail_trigger,
                source=state.value,
                dest=self.spec.failed.value,
                step=self.step_index,
                weight_version=self.weight_version,
                t_start=t0,
                t_enter=t0,
                t_end=time.time(),
                ok=False,
                error=str(self.failure),
                engine_state=self._native_engine_state(),
            )
        )
        self._log(logging.ERROR, "%s -> Failed: %s", state.value, self.failure)

    def _quiesce_after_failure(self) -> None:
        """Best effort, local only (a peer may be dead, so no barrier): collector paused, engine suspended."""
        if self.collector is not None and self.collector_condition is not CollectorCondition.PAUSED:
            try:
                self.collector.pause()
                self.collector_condition = CollectorCondition.PAUSED
            except Exception:
                self._log(logging.ERROR, "collector.pause() failed after a failure", exc_info=True)
                self.collector_condition = CollectorCondition.UNKNOWN
        if self.engine_condition is EngineCondition.AWAKE:
            try:
                self.engine.suspend()
                self.engine_condition = EngineCondition.SUSPENDED
            except Exception:
                self._log(logging.ERROR, "engine.suspend() failed after a failure", exc_info=True)
                self.engine_condition = EngineCondition.UNKNOWN

    def _validate(self) -> None:
        assert self._validator is not None
        try:
            self.last_validation = self._validator(self.step_index, self.weight_version)
        except Exception as exc:
            err = _ActionError("validate", "validate", exc)
            self._fail(err)
            raise self.failure from exc  # type: ignore[misc]

    # ------------------------------------------------------------------ internals: actions
    def _bind_actions(self) -> dict[str, Callable[[], None]]:
        """One interpreter of the spec: every action runs its role's adapter call, then its declared effects."""
        actions: dict[str, Callable[[], None]] = {}
        for a in self.spec.actions:
            if a.role is None or not hasattr(self, f"_role_{a.role.value}"):
                raise ConfigError("spec.actions", a.name, f"an action with a Role ({', '.join(r.value for r in Role)})")
            actions[a.name] = self._interpreter(a)
        return actions

    def _interpreter(self, a: ActionSpec) -> Callable[[], None]:
        role_impl: Callable[[ActionSpec], None] = getattr(self, f"_role_{a.role.value}")  # type: ignore[union-attr]
        # what the declaration says, read once: the action runs on every transition that names it
        facts, issues, cleared = self.facts, a.issues, a.cleared()
        sets = () if a.role is Role.BARRIER else a.sets  # the barrier sets handoff_complete only over a drained device
        before, after = f"before {a.name}", f"after {a.name}"

        def run() -> None:
            self._check_preconditions(a)
            self._check_engine_state(before)
            if issues is not None:
                self.ledger.issue(issues)
                facts[Fact.HANDOFF_COMPLETE] = False
            role_impl(a)
            for f in cleared:
                facts[f] = False
            for f in sets:
                facts[f] = True
            self.engine_condition = a.engine or self.engine_condition
            self.collector_condition = a.collector or self.collector_condition
            self.request_condition = a.requests or self.request_condition
            self._check_engine_state(after)

        return run

    def _check_engine_state(self, when: str) -> None:
        """The engine's report of its condition must agree with the lifecycle's (engines that report one; see
        :mod:`colo_fsm.guards.engine_state`). Not after a failure: the local teardown from Failed runs whatever
        state the failure left the engine in."""
        if self.failure is not None:
            return
        report = engine_state_of(self.engine)
        if report is None or report.condition is self.engine_condition:
            return  # nothing reported, or it agrees: the common case, without building the error's context
        hint = ""
        if when == "at start" and report is not None:
            hint = start_hint(report, spec_name=self.spec.name, up_at_construction=self.spec.engine_up_at_construction)
        check_engine_state(
            report,
            self.engine_condition,
            when=when,
            state=self._entering.value,
            rank=self.rank,
            weight_version=self.weight_version,
            hint=hint,
        )

    def _native_engine_state(self) -> str | None:
        """The engine's own state name for the trace (None when it reports none, or cannot say now)."""
        try:
            report = engine_state_of(self.engine)
        except Exception:
            return None
        return report.native if report is not None else None

    def _refuse(self, what: str) -> LifecycleError:
        return LifecycleError(what, state=self.state.value, rank=self.rank, weight_version=self.weight_version)


def _holds(t: TransitionSpec, facts: dict[Fact, bool]) -> bool:
    """``t.enabled(facts)`` for the lifecycle's own facts (every fact present), without a generator per guard."""
    for f in t.when:
        if not facts[f]:
            return False
    for f in t.unless:
        if facts[f]:
            return False
    return True


class _ActionError(Exception):
    def __init__(self, action: str, trigger: str, cause: BaseException) -> None:
        super().__init__(action)
        self.action = action
        self.trigger = trigger
        self.cause = cause


__all__ = ["Lifecycle", "LifecycleConfig", "LifecycleStatus"]
