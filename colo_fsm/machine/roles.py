"""What each action role of the spec does on this rank's adapters: the ``_role_<role>`` implementations, the
preconditions every action of a kind checks, the decisions a latch takes and the fingerprint a barrier
exchanges. Mixed into :class:`~colo_fsm.machine.lifecycle.Lifecycle`, whose state they read and write; the spec
says which action runs which role and what it sets, the lifecycle's interpreter runs them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from colo_fsm.adapters.protocols import StepResult
from colo_fsm.errors import ConfigError, EngineRebuild
from colo_fsm.guards.decision import CheckpointDecision
from colo_fsm.guards.fingerprint import HandoffFingerprint
from colo_fsm.guards.mode import check_training_mode, mode_digest, report_of
from colo_fsm.guards.sampling import data_parallel_rank, stream_of
from colo_fsm.states.spec import ActionSpec, Collective, CollectorCondition, EngineCondition, Fact, Role
from colo_fsm.states.walk import stop_upgrades

if TYPE_CHECKING:
    from colo_fsm.adapters.protocols import Collector, GenerationEngine, Trainer
    from colo_fsm.errors import LifecycleError
    from colo_fsm.guards.barrier import Barrier
    from colo_fsm.guards.decision import LatchedDecision
    from colo_fsm.guards.handoff import HandoffLedger
    from colo_fsm.machine.config import LifecycleConfig
    from colo_fsm.states.spec import LifecycleSpec, State


class ActionRoles:
    """The role implementations of :class:`~colo_fsm.machine.lifecycle.Lifecycle` (one method per
    :class:`~colo_fsm.states.spec.Role`, found by name when the spec's actions are bound)."""

    if TYPE_CHECKING:  # the lifecycle's state the roles read and write (Lifecycle.__init__ sets each)
        config: LifecycleConfig
        spec: LifecycleSpec
        engine: GenerationEngine
        trainer: Trainer
        collector: Collector | None
        rank: int
        step_index: int
        weight_version: int
        facts: dict[Fact, bool]
        engine_condition: EngineCondition
        collector_condition: CollectorCondition
        ledger: HandoffLedger
        checkpoint_decision: LatchedDecision
        validation_decision: LatchedDecision
        early_stop: LatchedDecision | None
        saves_on_early_stop: bool
        dp_openai_server_base_urls: list[str]
        last_result: StepResult | None
        last_validation: Mapping[str, float] | None
        _barrier: Barrier
        _batch: Any
        _unused: list[Any]
        _pending: tuple[str, float, State]
        _drain: Callable[[], object]
        _entering: State
        _latched_step: int | None
        _validated_this_step: bool
        _checkpoint_extra: Callable[[], Mapping[str, Any]] | None
        _server_urls_sink: Callable[[list[str]], None] | None
        _collector_takes_version: bool

        @property
        def state(self) -> State: ...

        def _log(self, level: int, msg: str, *args: Any, exc_info: bool = False) -> None: ...

        def _refuse(self, what: str) -> LifecycleError: ...

    def _check_preconditions(self, a: ActionSpec) -> None:
        """What every action of a kind requires, read from its declaration (issues, role), not from its name."""
        if a.issues in (Collective.TRAIN, Collective.CHECKPOINT) and (
            self.engine_condition is not EngineCondition.SUSPENDED
            or self.collector_condition is not CollectorCondition.PAUSED
        ):
            kind = "training step" if a.issues is Collective.TRAIN else "checkpoint save"
            raise self._refuse(
                f"{kind} ({a.name}) with engine {self.engine_condition.value} and collector "
                f"{self.collector_condition.value}; both must be down"
            )
        if a.issues is Collective.DECODE:
            if self.facts.get(Fact.SAVE_PENDING):
                raise self._refuse(f"{a.name} with a checkpoint save not finalized (every checkpoint collective first)")
            if self.facts.get(Fact.LAST_STEP) and (
                a.role is Role.RESUME_COLLECTOR or not self.spec.state(self._entering).validates
            ):
                raise self._refuse(f"{a.name} after the last step latched (only a validation-only wake is allowed)")
        if a.role is Role.RESUME_COLLECTOR and self.engine_condition is not EngineCondition.AWAKE:
            raise self._refuse("collector resumed while the engine is not awake")
        if (
            a.role is Role.SAVE
            and self.spec.validate_before_save
            and self.facts.get(Fact.VALIDATE_THIS_STEP)
            and not self._validated_this_step
        ):
            raise self._refuse(f"{a.name} before the step's validation (this spec validates before the save)")
        if a.role is Role.TEARDOWN and not self.spec.state(self._entering).terminal:
            raise self._refuse("engine teardown outside Stopped")

    def _decide(self, fact: Fact) -> bool:
        step = self.step_index
        cd = self.checkpoint_decision
        deadline_stop = isinstance(cd, CheckpointDecision) and cd.stops_run(step)
        if fact is Fact.SAVE_THIS_STEP:
            return bool(cd.decide(step))
        last = (self.config.num_steps is not None and step + 1 >= self.config.num_steps) or deadline_stop
        if fact is Fact.LAST_STEP:
            return last
        if fact is Fact.VALIDATE_THIS_STEP:
            return bool(self.validation_decision.decide(step)) or (last and self.config.val_at_end)
        if fact is Fact.VALIDATE_AT_START:  # before this run's first step, a resumed run's too (never ignored)
            return self.config.val_at_start
        raise ConfigError("spec.actions", fact.value, "a fact a latch can decide")

    def _role_build(self, a: ActionSpec) -> None:
        if self.facts[Fact.ENGINE_BUILT]:
            raise EngineRebuild(
                "the colocated engine is built exactly once per run",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        self.engine.bring_up()

    def _role_adopt(self, a: ActionSpec) -> None:
        if self.facts[Fact.ENGINE_BUILT]:
            raise EngineRebuild(
                "the colocated engine is adopted exactly once per run",
                state=self.state.value,
                rank=self.rank,
                weight_version=self.weight_version,
            )
        # still awake, as declared: checked before this action, like every action; nothing is built here
        urls = self.engine.server_base_urls()
        if isinstance(urls, str) or not all(isinstance(u, str) and u for u in urls):
            raise ConfigError("engine.server_base_urls()", urls, "a list of base URLs (strings), empty if no server")

    def _role_publish(self, a: ActionSpec) -> None:
        self.dp_openai_server_base_urls = list(self.engine.server_base_urls())
        if self._server_urls_sink is not None:
            self._server_urls_sink(list(self.dp_openai_server_base_urls))
        if self.dp_openai_server_base_urls:
            self._log(logging.INFO, "dp_openai_server_base_urls=%s", self.dp_openai_server_base_urls)

    def _role_latch(self, a: ActionSpec) -> None:
        # save first: the deadline rule that may end the run fires inside the checkpoint decision
        order = sorted(a.decides, key=lambda f: f is not Fact.SAVE_THIS_STEP)
        decided = {f: self._decide(f) for f in order}
        self.facts.update(decided)
        if Fact.SAVE_THIS_STEP in a.decides or Fact.LAST_STEP in a.decides:
            self._latched_step = self.step_index
            self._validated_this_step = False
        self._log(logging.INFO, "step %d decisions: %s", self.step_index, _Decisions(decided))

    def _role_latch_stop(self, a: ActionSpec) -> None:
        # asked with the validator's step: the steps trained so far (start_step at start, s + 1 after step s)
        step = self.step_index
        stop = bool(self.early_stop.decide(step)) if self.early_stop is not None else False
        for f in a.decides:
            self.facts[f] = stop
        if stop:
            upgraded = stop_upgrades(a, self.facts, save_on_stop=self.saves_on_early_stop)
            for f in upgraded:
                self.facts[f] = True
            self._log(logging.INFO, "after %d step(s): early stop latched (%s)", step, ", ".join(map(str, upgraded)))

    def _role_pause(self, a: ActionSpec) -> None:
        if self.collector is not None:
            self.collector.pause()

    def _role_suspend(self, a: ActionSpec) -> None:
        self.engine.suspend()
        if getattr(self.engine, "decode_in_flight", False) is True:
            raise self._refuse("engine.suspend() returned with a decode step in flight (park at a step boundary)")

    def _role_drain(self, a: ActionSpec) -> None:
        self._drain()
        self.ledger.record_drain()

    def _fingerprint(self) -> HandoffFingerprint:
        """This rank's view at a handoff barrier: state, step, version, latched decisions, model mode."""
        report = report_of(self.engine)
        # guards: the engine's sampling stream, keyed by the replica as the lifecycle sees it (not as the engine
        # was told), so two replicas whose engines share a stream are refused (guards/sampling.py)
        stream = stream_of(self.engine)
        replica = data_parallel_rank(self.config.data_parallel_rank, default=self.config.rank) if stream else -1
        return HandoffFingerprint(
            state=self.state.value,
            step=self.step_index,
            weight_version=self.weight_version,
            save=self.facts[Fact.SAVE_THIS_STEP],
            validate=self.facts[Fact.VALIDATE_THIS_STEP],
            last=self.facts[Fact.LAST_STEP],
            mode_digest=mode_digest(report),
            dp_rank=replica,
            sampling_seed=stream.seed if stream is not None else 0,
            mode=report,
        )

    def _role_barrier(self, a: ActionSpec) -> None:
        self.ledger.before_barrier()
        if getattr(self._barrier, "exchanges_fingerprints", False):  # the fingerprint travels with the barrier
            self._barrier.wait(  # type: ignore[call-arg]
                state=self.state.value, weight_version=self.weight_version, fingerprint=self._fingerprint()
            )
        else:
            self._barrier.wait(state=self.state.value, weight_version=self.weight_version)
        self.ledger.record_barrier()
        for f in a.sets:
            self.facts[f] = self.ledger.complete

    def _role_restore(self, a: ActionSpec) -> None:
        self.trainer.restore_buffers()

    def _role_train(self, a: ActionSpec) -> None:
        check_training_mode(  # no training forward on a model some switch still holds in inference mode
            report_of(self.engine), state=self.state.value, rank=self.rank, weight_version=self.weight_version
        )
        result = self.trainer.train_step(self._batch)
        self.last_result = _step_result(result, self._batch)

    def _role_bump(self, a: ActionSpec) -> None:
        if self.facts[Fact.STEP_TRAINED]:
            raise self._refuse("weight version bumped twice in one step")
        self.weight_version += 1
        self.step_index += 1

    def _role_offload(self, a: ActionSpec) -> None:
        self.trainer.offload_buffers()

    def _role_save(self, a: ActionSpec) -> None:
        extra: dict[str, Any] = {"colo_fsm": {"step": self.step_index, "weight_version": self.weight_version}}
        if self.spec.validate_before_save and self._validated_this_step and self.last_validation is not None:
            extra["validation"] = dict(self.last_validation)
        if self._checkpoint_extra is not None:
            extra.update(self._checkpoint_extra())
        self.trainer.save_checkpoint(self.step_index, self.weight_version, extra)

    def _role_finalize(self, a: ActionSpec) -> None:
        self.trainer.finalize_checkpoint()  # type: ignore[attr-defined]  # required at construction

    def _role_resume(self, a: ActionSpec) -> None:
        counts = getattr(self.engine, "request_counts", None)
        self.engine.resume()
        if callable(counts):
            left = getattr(counts(), "parked", 0)
            if left:
                raise self._refuse(f"engine.resume() left {left} request(s) parked (each parked request resumes once)")

    def _role_resume_collector(self, a: ActionSpec) -> None:
        if self.collector is not None:
            if self._collector_takes_version:
                self.collector.resume(weight_version=self.weight_version)  # type: ignore[call-arg]
            else:
                self.collector.resume()

    def _role_return_prompts(self, a: ActionSpec) -> None:
        take_back = getattr(self.collector, "take_back", None) if self.collector is not None else None
        if not callable(take_back):
            return
        returned = take_back(list(self._unused))
        abandoned = self._latched_step == self.step_index and not self.facts[Fact.STEP_TRAINED]
        self._log(
            logging.INFO,
            "stop from %s%s: %d item(s) of the unused batch and %s prompt(s) in flight back to the collector",
            self._pending[2].value,
            f" (step {self.step_index} abandoned, not trained)" if abandoned else "",
            len(self._unused),
            returned if isinstance(returned, int) else "its",
        )

    def _role_teardown(self, a: ActionSpec) -> None:
        if self.engine_condition not in (EngineCondition.ABSENT, EngineCondition.TORN_DOWN):
            self.engine.shutdown()
        for part in (self.trainer, self.collector):
            hook = getattr(part, "teardown", None) if part is not None else None
            if callable(hook):
                hook()


class _Decisions:
    """A latch's decisions as log text (``save=True validate=False last=False``), built only if the line is
    emitted: the latch runs every step, its INFO line is usually off."""

    __slots__ = ("decided",)

    def __init__(self, decided: Mapping[Fact, bool]) -> None:
        self.decided = decided

    def __str__(self) -> str:
        return " ".join(
            f"{f.value.removesuffix('_this_step').removesuffix('_step')}={v}" for f, v in self.decided.items()
        )


def _step_result(result: Any, batch: Any) -> StepResult:
    """A trainer's return value as a :class:`StepResult`: a StepResult, a Mapping of metrics, or None."""
    if isinstance(result, StepResult):
        return result
    if result is None:
        return StepResult()
    if isinstance(result, Mapping):
        metrics = dict(result)
        consumed = metrics.pop("consumed_samples", None)
        if consumed is None:
            if isinstance(batch, Mapping):  # its len counts keys (fields), not samples
                raise ConfigError(
                    "train_step result",
                    sorted(map(str, result)),
                    "a 'consumed_samples' entry (or a StepResult): the batch is a mapping, whose len counts its "
                    "keys, not samples",
                )
            consumed = len(batch) if hasattr(batch, "__len__") else 0
        return StepResult(metrics=metrics, consumed_samples=int(consumed))
    raise ConfigError("train_step result", type(result).__name__, "a StepResult, a Mapping of metrics, or None")


__all__ = ["ActionRoles"]
