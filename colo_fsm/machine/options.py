"""No option silently ignored: every run option either takes effect in the spec it runs or is refused here.

:class:`~colo_fsm.machine.lifecycle.Lifecycle` calls :func:`refuse_ignored_options` at construction; each refusal
is a :class:`~colo_fsm.errors.ConfigError` naming the option, the spec and what would make the option work.
"""

from __future__ import annotations

from typing import Any

from colo_fsm.errors import ConfigError
from colo_fsm.guards.decision import CheckpointDecision, ValidationDecision
from colo_fsm.states.spec import Fact, LifecycleSpec, Role
from colo_fsm.states.walk import last_step_validates


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
) -> None:
    """Raise :class:`ConfigError` for the first option ``spec`` would ignore (``checkpoint`` etc. are what the
    caller passed, None when not given)."""
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


__all__ = ["async_save", "checkpointing_enabled", "refuse_ignored_options"]
