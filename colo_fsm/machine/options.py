"""No option silently ignored: every run option either takes effect in the spec it runs or is refused here.

:class:`~colo_fsm.machine.lifecycle.Lifecycle` calls :func:`refuse_ignored_options` at construction; each refusal
is a :class:`~colo_fsm.errors.ConfigError` naming the option, the spec and what would make the option work.
"""

from __future__ import annotations

from typing import Any

from colo_fsm.errors import ConfigError
from colo_fsm.guards.decision import CheckpointDecision, ValidationDecision
from colo_fsm.states.spec import Fact, LifecycleSpec, Role
from colo_fsm.states.walk import last_step_validates, path_text, step_path


def _decides(spec: LifecycleSpec, fact: Fact) -> bool:
    return any(fact in spec.action(n).decides for n in spec.with_role(Role.LATCH, Role.LATCH_STOP))


def checkpointing_enabled(checkpoint: Any) -> bool:
    """Whether a checkpoint decision can ever say save (a :class:`CheckpointDecision` with no period and no time
    rule never does; any other decision is taken to)."""
    if checkpoint is None:
        return False
    if isinstance(checkpoint, CheckpointDecision):
        return any(x is not None for x in (checkpoint.every_steps, checkpoint.must_save_by, checkpoint.save_and_stop))
    return True


def async_save(spec: LifecycleSpec) -> str | None:
    """The action that finalizes ``spec``'s asynchronous save (a FINALIZE role, or a save that leaves one
    pending), or None when its save is synchronous."""
    fin = spec.with_role(Role.FINALIZE)
    if fin:
        return fin[0]
    pending = [a.name for a in spec.actions if a.role is Role.SAVE and Fact.SAVE_PENDING in a.writes()]
    return pending[0] if pending else None


def validation_can_fire(validation: Any) -> bool:
    """Whether a validation decision can ever say validate (a :class:`ValidationDecision` without a period never
    does; any other decision is taken to)."""
    if validation is None:
        return False
    return not isinstance(validation, ValidationDecision) or validation.every_steps is not None


def _never_fires(
    spec: LifecycleSpec, decisions: dict[Fact, bool], reaches: Any, *, through: bool = False
) -> str | None:
    """The path a step latched with ``decisions`` takes in ``spec`` when it never ``reaches`` (a predicate on the
    path) what the decision asks for, else None."""
    try:
        path = step_path(spec, decisions, through_validation=through)
    except ConfigError as exc:
        return str(exc)
    return None if reaches(path) else path_text(path)


def refuse_ignored_options(
    spec: LifecycleSpec,
    config: Any,
    *,
    trainer: Any,
    checkpoint: Any,
    validation: Any,
    validator: Any,
    early_stop: Any,
    checkpoint_extra: Any,
    server_urls_sink: Any,
    engine: Any = None,
    drain: Any = None,
    barrier: Any = None,
    walk_spec: bool = True,
) -> None:
    """Raise :class:`ConfigError` for the first option ``spec`` would ignore, or that could never take effect
    with the others (``checkpoint`` etc. are what the caller passed, None when not given). ``walk_spec=False``
    (mutation testing, with the spec validator off) skips the refusals that walk the spec's steps."""
    name = f"spec {spec.name}"
    validates = any(s.validates for s in spec.states)
    saves = bool(spec.with_role(Role.SAVE))
    if config.val_at_start and not _decides(spec, Fact.VALIDATE_AT_START):
        raise ConfigError(
            "val_at_start", True, f"a spec with an action deciding validate_at_start ({name} has none; e.g. NEMO_RL)"
        )
    if config.val_at_end and not last_step_validates(spec):
        raise ConfigError(
            "val_at_end",
            True,
            f"a spec whose last step wakes the engine for validation ({name} never wakes it on the last step; "
            "e.g. NEMO_RL, or validate after the run with val_at_end=False)",
        )
    if early_stop is not None and not _decides(spec, Fact.STOP_EARLY):
        raise ConfigError("early_stop", early_stop, f"a spec with an action deciding stop_early ({name}; e.g. NEMO_RL)")
    if (
        early_stop is not None
        and isinstance(validation, ValidationDecision | None)
        and (validation is None or validation.every_steps is None)
        and not config.val_at_start
        and not config.val_at_end
    ):
        raise ConfigError(
            "early_stop",
            early_stop,
            "a run that validates (validation=ValidationDecision(n), val_at_start or val_at_end): the early stop is "
            "decided after a validation, and this run never validates",
        )
    if config.save_on_early_stop is not None and early_stop is None:
        raise ConfigError("save_on_early_stop", config.save_on_early_stop, "an early_stop decision to act on")
    if config.save_on_early_stop and not saves:
        raise ConfigError("save_on_early_stop", True, f"a spec with a save action ({name} has none)")
    for option, value in (("validation", validation), ("validator", validator)):
        if value is not None and not validates:
            raise ConfigError(option, value, f"a spec with a validation-only state ({name} has none)")
    for option, value in (("checkpoint", checkpoint), ("checkpoint_extra", checkpoint_extra)):
        if value is not None and not saves:
            raise ConfigError(option, value, f"a spec with a save action ({name} has none)")
    if server_urls_sink is not None and not spec.with_role(Role.PUBLISH):
        raise ConfigError("server_urls_sink", server_urls_sink, f"a spec that publishes server URLs ({name} does not)")
    if config.num_steps is not None and not (_decides(spec, Fact.LAST_STEP) and Fact.LAST_STEP in spec.guard_facts()):
        raise ConfigError(
            "num_steps", config.num_steps, f"a spec whose guards read last_step ({name} never ends a run)"
        )
    if (
        config.world_size > 1
        and isinstance(checkpoint, CheckpointDecision)
        and checkpoint.needs_agreement
        and not checkpoint.agrees
    ):
        rules = " and a ".join(checkpoint.time_rules)
        raise ConfigError(
            "checkpoint.agree",
            None,
            f"an agree function (e.g. broadcast_from_rank0()) when world_size={config.world_size} and a {rules} time "
            "rule is set: otherwise each rank's own clock decides whether to save and stop, and the ranks split at "
            "the next barrier",
        )
    if walk_spec:
        _refuse_decisions_that_never_fire(spec, checkpoint, validation, early_stop)
    _refuse_hooks_without_decisions(spec, config, checkpoint, validation, validator, checkpoint_extra)
    for option, value, role in (("drain", drain, Role.DRAIN), ("barrier", barrier, Role.BARRIER)):
        if value is not None and not spec.with_role(role):
            raise ConfigError(option, value, f"a spec with a {role.value} action ({name} has none)")
    ranks = getattr(barrier, "world_size", None)
    if isinstance(ranks, int) and ranks != config.world_size:
        raise ConfigError(
            "config.world_size",
            config.world_size,
            f"the {ranks} ranks the barrier spans ({type(barrier).__name__}): LifecycleConfig(rank=..., "
            f"world_size={ranks})",
        )
    if config.data_parallel_rank is not None and not callable(getattr(engine, "sampling_stream", None)):
        raise ConfigError(
            "data_parallel_rank",
            config.data_parallel_rank,
            f"an engine that reports its sampling stream (sampling_stream()); {type(engine).__name__} has none, so "
            "the handoff fingerprint never reads the replica",
        )
    finalizer = async_save(spec)
    if finalizer is not None and not callable(getattr(trainer, "finalize_checkpoint", None)):
        raise ConfigError(
            "trainer.finalize_checkpoint",
            getattr(trainer, "finalize_checkpoint", None),
            f"a finalize hook: {name} saves asynchronously and waits for every collective of the save before any "
            f"wake ({finalizer}); give the trainer finalize_checkpoint() (a no-op when its save is synchronous)",
        )
    if getattr(trainer, "async_save", False) is True and finalizer is None:
        raise ConfigError(
            "trainer.async_save",
            True,
            f"a spec that finalizes an asynchronous save before any wake ({name} saves synchronously; e.g. NEMO_RL)",
        )


def _refuse_decisions_that_never_fire(spec: LifecycleSpec, checkpoint: Any, validation: Any, early_stop: Any) -> None:
    """A decision that says yes reaches what it asks for in the spec (walked over the declared effects)."""
    name = f"spec {spec.name}"
    saves = bool(spec.with_role(Role.SAVE))
    if validation_can_fire(validation):
        path = _never_fires(
            spec, {Fact.VALIDATE_THIS_STEP: True}, lambda p: any(spec.state(t.dest).validates for t in p)
        )
        if path is not None:
            raise ConfigError(
                "validation",
                validation,
                f"a spec in which a step decided to validate reaches a validation-only state ({name}: such a step "
                f"goes {path}, so it would never validate)",
            )
    if checkpointing_enabled(checkpoint) and saves:
        path = _never_fires(
            spec,
            {Fact.SAVE_THIS_STEP: True},
            lambda p: any(spec.action(a).role is Role.SAVE for t in p for a in t.actions),
        )
        if path is not None:
            raise ConfigError(
                "checkpoint",
                checkpoint,
                f"a spec in which a step decided to save runs its save action ({name}: such a step goes {path}, "
                "so it would never save)",
            )
    if early_stop is not None and _decides(spec, Fact.STOP_EARLY):
        path = _never_fires(
            spec,
            {Fact.VALIDATE_THIS_STEP: True},
            lambda p: any(spec.action(a).role is Role.LATCH_STOP for t in p for a in t.actions),
            through=True,
        )
        if path is not None:
            raise ConfigError(
                "early_stop",
                early_stop,
                f"a spec that decides the early stop after a step's validation ({name}: a validating step goes "
                f"{path} and never decides it)",
            )


def _refuse_hooks_without_decisions(
    spec: LifecycleSpec, config: Any, checkpoint: Any, validation: Any, validator: Any, checkpoint_extra: Any
) -> None:
    """A hook has a decision to call it: a validator a validation to run, a checkpoint hook a save to add to, and
    a time rule what it needs (a spec that ends runs, a run length)."""
    name = f"spec {spec.name}"
    saves = bool(spec.with_role(Role.SAVE))
    # a hook with no decision at all is a forgotten decision; an explicit one that says never (a period of None,
    # say from a config) turns the hook off on purpose
    if validator is not None and validation is None and not (config.val_at_start or config.val_at_end):
        raise ConfigError(
            "validator",
            validator,
            "a run that validates: validation=ValidationDecision(every_steps), val_at_start or val_at_end (without "
            "one the validator is never called)",
        )
    if checkpoint_extra is not None and saves and checkpoint is None and not config.save_on_early_stop:
        raise ConfigError(
            "checkpoint_extra",
            checkpoint_extra,
            "a run that saves: checkpoint=CheckpointDecision(every_steps, ...) or save_on_early_stop=True (without "
            "one the hook is never called)",
        )
    if isinstance(checkpoint, CheckpointDecision):
        if checkpoint.save_on_last_step and config.num_steps is None:
            raise ConfigError(
                "checkpoint.save_on_last_step",
                True,
                "a run with num_steps (only then is the last step known; a time rule that ends the run saves anyway)",
            )
        if _time_rule_ends_run(checkpoint) and Fact.LAST_STEP not in spec.guard_facts():
            raise ConfigError(
                "checkpoint.deadline_stop",
                True,
                f"a spec whose guards read last_step ({name} never ends a run, so the time rule's stop would be "
                "ignored; pass deadline_stop=False to only save)",
            )


def _time_rule_ends_run(checkpoint: Any) -> bool:
    return isinstance(checkpoint, CheckpointDecision) and checkpoint.needs_agreement and checkpoint.deadline_stop


__all__ = ["async_save", "checkpointing_enabled", "refuse_ignored_options", "validation_can_fire"]
