"""The runtime lifecycle machine, built from the declared spec on ``transitions``.

One :class:`Lifecycle` per rank in SPMD runs (every rank runs the loop, e.g. under torchrun), or one in the
driver of a single-controller run whose adapters fan out to workers. It is synchronous and thread-safe; an
asyncio loop uses :class:`colo_fsm.machine.aio.AsyncLifecycle`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transitions import Machine, MachineError

from colo_fsm.adapters.protocols import Collector, GenerationEngine, StepResult, Trainer
from colo_fsm.errors import (
    ActionFailed,
    ConfigError,
    EngineRebuild,
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
from colo_fsm.guards.fingerprint import HandoffFingerprint
from colo_fsm.guards.handoff import HandoffLedger
from colo_fsm.guards.mode import check_training_mode, mode_digest, report_of
from colo_fsm.log import format_prefix, heartbeat
from colo_fsm.log import set_context as _log_context
from colo_fsm.machine.trace import Trace, TraceRecord
from colo_fsm.states.spec import (
    LIFECYCLE,
    CollectorCondition,
    EngineCondition,
    Fact,
    LifecycleSpec,
    State,
    TransitionSpec,
)
from colo_fsm.states.validate import validate_spec

log = logging.getLogger("colo_fsm.lifecycle")
_STATE_BY_NAME = {s.value: s for s in State}


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, value, f"an integer >= {minimum}")


@dataclass(frozen=True)
class LifecycleConfig:
    """Run-level settings of a :class:`Lifecycle`.

    ``num_steps`` is the number of training steps in the run (None: until :meth:`Lifecycle.stop`); the
    step with index ``num_steps - 1`` is the last and never wakes the engine. ``start_step`` and
    ``start_weight_version`` are where a resumed run picks up.
    """

    num_steps: int | None = None
    rank: int = 0
    world_size: int = 1
    start_step: int = 0
    start_weight_version: int = 0
    async_training: bool = True
    trace_path: str | Path | None = None
    progress_interval_s: float = 30.0  # log a progress line while one action runs longer than this

    def __post_init__(self) -> None:
        if self.num_steps is not None:
            _check_int("num_steps", self.num_steps, minimum=1)
        _check_int("rank", self.rank, minimum=0)
        _check_int("world_size", self.world_size, minimum=1)
        if self.rank >= self.world_size:
            raise ConfigError("rank", self.rank, f"less than world_size={self.world_size}")
        _check_int("start_step", self.start_step, minimum=0)
        _check_int("start_weight_version", self.start_weight_version, minimum=0)
        if self.num_steps is not None and self.start_step >= self.num_steps:
            raise ConfigError("start_step", self.start_step, f"less than num_steps={self.num_steps}")
        if not isinstance(self.async_training, bool):
            raise ConfigError("async_training", self.async_training, "True or False")
        if (
            isinstance(self.progress_interval_s, bool)
            or not isinstance(self.progress_interval_s, int | float)
            or not self.progress_interval_s > 0
        ):
            raise ConfigError("progress_interval_s", self.progress_interval_s, "a positive number of seconds")
        if self.trace_path is not None and not isinstance(self.trace_path, str | Path):
            raise ConfigError("trace_path", self.trace_path, "a file path (str or pathlib.Path) or None")


@dataclass
class _Model:
    """The object ``transitions`` keeps the state on."""

    state: str = State.CREATED.value


@dataclass
class LifecycleStatus:
    """A snapshot of where the machine is (for progress displays, health endpoints and checkpoints)."""

    state: str
    rank: int
    step: int
    weight_version: int
    engine: str
    collector: str
    facts: dict[str, bool] = field(default_factory=dict)
    failure: str | None = None


class Lifecycle:
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
        checkpoint_extra: Callable[[], Mapping[str, Any]] | None = None,
        server_urls_sink: Callable[[list[str]], None] | None = None,
        spec: LifecycleSpec = LIFECYCLE,
        check_spec: bool = True,
    ) -> None:
        _check_arguments(
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
        if (
            self.config.world_size > 1
            and isinstance(checkpoint, CheckpointDecision)
            and checkpoint.needs_agreement
            and checkpoint._agree is None
        ):
            raise ConfigError(
                "checkpoint.agree",
                None,
                f"an agree function (e.g. broadcast_from_rank0()) when world_size={self.config.world_size} and a "
                "must_save_by_s time rule is set: otherwise each rank's own clock decides whether to save and stop, "
                "and the ranks split at the next barrier",
            )
        if check_spec:  # False only for mutation testing: a spec the validator rejects, caught at run time
            validate_spec(spec)
        self.spec = spec
        self.engine = engine
        self.trainer = trainer
        self.collector = collector
        self.rank = self.config.rank
        self._drain = drain if drain is not None else default_drain()
        self._barrier = barrier or SoloBarrier()
        self.checkpoint_decision = checkpoint or CheckpointDecision()
        self.validation_decision = validation or ValidationDecision()
        self._validator = validator
        self._checkpoint_extra = checkpoint_extra
        self._server_urls_sink = server_urls_sink
        self.step_index = self.config.start_step
        self.weight_version = self.config.start_weight_version
        self.engine_condition = EngineCondition.ABSENT
        self.collector_condition = CollectorCondition.PAUSED
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
        """Build the engine once and start collection (Created -> Generating)."""
        return self.fire("start")

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
            if self._validator is not None and self.can("end_validation"):
                self._validate()
                self.end_validation()
            assert self.last_result is not None
            return self.last_result

    def stop(self) -> State:
        """Tear down (the only place teardown happens) and end in Stopped."""
        try:
            return self.fire("stop")
        finally:
            if self.spec.state(self.state).terminal:
                self.trace.close()

    def close(self) -> None:
        """Close the trace file."""
        self.trace.close()

    # ------------------------------------------------------------------ internals: transitions
    def _reader(self, fact: Fact) -> Callable[..., bool]:
        facts = self.facts
        return lambda *_a, **_k: facts[fact]

    def _fire(self, trigger: str) -> None:
        state = self.state
        if trigger not in self.spec.triggers(state):
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
        while True:
            state = self.state
            outgoing = [t for t in self.spec.outgoing(state) if t.automatic]
            auto = [t for t in outgoing if t.enabled(self.facts)]
            if auto:
                self._fire(auto[0].trigger)
                continue
            if outgoing and not self.spec.state(state).resting:
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
        def run(*_a: Any, **_k: Any) -> None:
            trigger, t_start, source = self._pending
            t_enter = time.time()
            self._action_times = {}
            ok, error = True, None
            try:
                _log_context(
                    rank=self.rank, state=t.dest.value, weight_version=self.weight_version, step=self.step_index
                )
                for name in t.actions:
                    self._current_action = name
                    self._action_t0 = time.monotonic()
                    a0 = time.perf_counter()
                    try:
                        self._actions[name]()
                    except Exception as exc:
                        raise _ActionError(name, trigger, exc) from exc
                    finally:
                        self._action_times[name] = self._action_times.get(name, 0.0) + time.perf_counter() - a0
                self._current_action = None
            except _ActionError as err:
                ok, error = False, f"{err.action}: {type(err.cause).__name__}: {err.cause}"
                raise
            finally:
                self._record(trigger, source, t.dest, t_start, t_enter, ok, error)
            self._log(
                logging.INFO,
                "%s -[%s]-> %s (%.1f ms)",
                source.value,
                trigger,
                t.dest.value,
                (time.time() - t_start) * 1e3,
            )

        return run

    def _record(
        self, trigger: str, source: State, dest: State, t_start: float, t_enter: float, ok: bool, error: str | None
    ) -> None:
        self._seq += 1
        self.trace.append(
            TraceRecord(
                seq=self._seq,
                rank=self.rank,
                trigger=trigger,
                source=source.value,
                dest=dest.value,
                step=self.step_index,
                weight_version=self.weight_version,
                t_start=t_start,
                t_enter=t_enter,
                t_end=time.time(),
                ok=ok,
                error=error,
                actions=dict(self._action_times),
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
            log.log(level, format_prefix(**extra) + msg, *args, extra=extra, exc_info=exc_info)

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
        if isinstance(err.cause, GuardRejected | HandoffDivergence | ModelModeError):
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
        actions: dict[str, Callable[[], None]] = {}
        for a in self.spec.actions:
            impl = getattr(self, f"_act_{a.name}", None)
            if impl is None:
                raise ConfigError("spec.actions", a.name, "an action the runtime implements")
            actions[a.name] = impl
        return actions

    def _issue(self, name: str) -> None:
        kind = self.spec.action(name).issues
        if kind is not None:
            self.ledger.issue(kind)
            self.facts[Fact.HANDOFF_COMPLETE] = False

    def _act_build_engine(self) -> None:
        if self.facts[Fact.ENGINE_BUILT]:
            raise EngineRebuild(
                "the colocated engine is built exactly once per run",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        self._issue("build_engine")
        self.engine.bring_up()
        self.facts[Fact.ENGINE_BUILT] = True
        self.engine_condition = EngineCondition.AWAKE

    def _act_publish_server_urls(self) -> None:
        self.dp_openai_server_base_urls = list(self.engine.server_base_urls())
        if self._server_urls_sink is not None:
            self._server_urls_sink(list(self.dp_openai_server_base_urls))
        if self.dp_openai_server_base_urls:
            self._log(logging.INFO, "dp_openai_server_base_urls=%s", self.dp_openai_server_base_urls)

    def _act_latch_step_decisions(self) -> None:
        step = self.step_index
        save = self.checkpoint_decision.decide(step)
        validate = self.validation_decision.decide(step)
        deadline_stop = isinstance(self.checkpoint_decision, CheckpointDecision) and self.checkpoint_decision.stops_run(
            step
        )
        last = (self.config.num_steps is not None and step + 1 >= self.config.num_steps) or deadline_stop
        self.facts[Fact.SAVE_THIS_STEP] = save
        self.facts[Fact.VALIDATE_THIS_STEP] = validate
        self.facts[Fact.LAST_STEP] = last
        self.facts[Fact.STEP_TRAINED] = False
        self._log(logging.INFO, "step %d decisions: save=%s validate=%s last=%s", step, save, validate, last)

    def _act_pause_collector(self) -> None:
        if self.collector is not None:
            self.collector.pause()
        self.collector_condition = CollectorCondition.PAUSED

    def _act_suspend_engine(self) -> None:
        self.engine.suspend()
        self.engine_condition = EngineCondition.SUSPENDED

    def _act_drain_device(self) -> None:
        self._drain()
        self.ledger.record_drain()

    def _fingerprint(self) -> HandoffFingerprint:
        """This rank's view at a handoff barrier: state, step, version, latched decisions, model mode."""
        report = report_of(self.engine)
        return HandoffFingerprint(
            state=self.state.value,
            step=self.step_index,
            weight_version=self.weight_version,
            save=self.facts[Fact.SAVE_THIS_STEP],
            validate=self.facts[Fact.VALIDATE_THIS_STEP],
            last=self.facts[Fact.LAST_STEP],
            mode_digest=mode_digest(report),
            mode=report,
        )

    def _act_barrier(self) -> None:
        self.ledger.before_barrier()
        if getattr(self._barrier, "exchanges_fingerprints", False):  # the fingerprint travels with the barrier
            self._barrier.wait(  # type: ignore[call-arg]
                state=self.state.value, weight_version=self.weight_version, fingerprint=self._fingerprint()
            )
        else:
            self._barrier.wait(state=self.state.value, weight_version=self.weight_version)
        self.ledger.record_barrier()
        self.facts[Fact.HANDOFF_COMPLETE] = self.ledger.complete

    def _act_restore_training_buffers(self) -> None:
        self.trainer.restore_buffers()

    def _act_train_step(self) -> None:
        if self.engine_condition is EngineCondition.AWAKE:
            raise LifecycleError(
                "training step while the engine is awake",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        check_training_mode(  # no training forward on a model some switch still holds in inference mode
            report_of(self.engine), state=self.state.value, rank=self.rank, weight_version=self.weight_version
        )
        self._issue("train_step")
        result = self.trainer.train_step(self._batch)
        self.last_result = result if isinstance(result, StepResult) else StepResult()

    def _act_bump_weight_version(self) -> None:
        if self.facts[Fact.STEP_TRAINED]:
            raise LifecycleError(
                "weight version bumped twice in one step",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        self.weight_version += 1
        self.step_index += 1
        self.facts[Fact.STEP_TRAINED] = True

    def _act_offload_training_buffers(self) -> None:
        self.trainer.offload_buffers()

    def _act_save_checkpoint(self) -> None:
        if (
            self.engine_condition is not EngineCondition.SUSPENDED
            or self.collector_condition is not CollectorCondition.PAUSED
        ):
            raise LifecycleError(
                f"checkpoint save with engine {self.engine_condition.value} and collector "
                f"{self.collector_condition.value}; both must be down",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        self._issue("save_checkpoint")
        extra: dict[str, Any] = {"colo_fsm": {"step": self.step_index, "weight_version": self.weight_version}}
        if self._checkpoint_extra is not None:
            extra.update(self._checkpoint_extra())
        self.trainer.save_checkpoint(self.step_index, self.weight_version, extra)

    def _act_resume_engine(self) -> None:
        self._issue("resume_engine")
        self.engine.resume()
        self.engine_condition = EngineCondition.AWAKE

    def _act_resume_collector(self) -> None:
        if self.engine_condition is not EngineCondition.AWAKE:
            raise LifecycleError(
                "collector resumed while the engine is not awake",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        self._issue("resume_collector")
        if self.collector is not None:
            self.collector.resume()
        self.collector_condition = CollectorCondition.RUNNING

    def _act_shutdown_engine(self) -> None:
        if self.state is not State.STOPPED:
            raise LifecycleError(
                "engine teardown outside Stopped",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        if self.facts[Fact.ENGINE_BUILT] and self.engine_condition is not EngineCondition.TORN_DOWN:
            self.engine.shutdown()
        self.engine_condition = EngineCondition.TORN_DOWN


_ENGINE_METHODS = ("bring_up", "suspend", "resume", "shutdown", "server_base_urls")
_TRAINER_METHODS = ("train_step", "offload_buffers", "restore_buffers", "save_checkpoint")
_COLLECTOR_METHODS = ("pause", "resume")


def _has(obj: Any, methods: tuple[str, ...]) -> bool:
    """Duck-typed protocol check that also accepts proxies resolving attributes in ``__getattr__``."""
    return obj is not None and all(callable(getattr(obj, m, None)) for m in methods)


def _check_arguments(
    engine: Any,
    trainer: Any,
    collector: Any,
    config: Any,
    drain: Any,
    barrier: Any,
    checkpoint: Any,
    validation: Any,
    spec: Any,
    **callbacks: Any,
) -> None:
    """Refuse wrong kinds of arguments up front, before anything runs (each error names the argument)."""
    checks: list[tuple[str, Any, bool, str]] = [
        ("engine", engine, _has(engine, _ENGINE_METHODS), f"a GenerationEngine ({', '.join(_ENGINE_METHODS)})"),
        ("trainer", trainer, _has(trainer, _TRAINER_METHODS), f"a Trainer ({', '.join(_TRAINER_METHODS)})"),
        (
            "collector",
            collector,
            collector is None or _has(collector, _COLLECTOR_METHODS),
            "a Collector (pause, resume) or None",
        ),
        ("config", config, config is None or isinstance(config, LifecycleConfig), "a LifecycleConfig or None"),
        ("drain", drain, drain is None or callable(drain), "a callable that drains this rank's device, or None"),
        ("barrier", barrier, barrier is None or _has(barrier, ("wait",)), "a Barrier (with wait()) or None"),
        (
            "checkpoint",
            checkpoint,
            checkpoint is None or _has(checkpoint, ("decide",)),
            "a LatchedDecision (e.g. CheckpointDecision) or None",
        ),
        (
            "validation",
            validation,
            validation is None or _has(validation, ("decide",)),
            "a LatchedDecision (e.g. ValidationDecision) or None",
        ),
        ("spec", spec, isinstance(spec, LifecycleSpec), "a LifecycleSpec"),
    ]
    checks += [(name, fn, fn is None or callable(fn), "a callable or None") for name, fn in callbacks.items()]
    for name, value, ok, expected in checks:
        if not ok:
            raise ConfigError(name, value, expected)


class _ActionError(Exception):
    def __init__(self, action: str, trigger: str, cause: BaseException) -> None:
        super().__init__(action)
        self.action = action
        self.trigger = trigger
        self.cause = cause


__all__ = ["Lifecycle", "LifecycleConfig", "LifecycleStatus"]
