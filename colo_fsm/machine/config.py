"""What a :class:`~colo_fsm.machine.lifecycle.Lifecycle` is given: its run-level settings
(:class:`LifecycleConfig`), the snapshot it reports (:class:`LifecycleStatus`), and the up-front check of its
constructor's arguments (each wrong kind of argument named before anything runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import LifecycleSpec, Role


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
    val_at_start: bool = False  # validate once before this run's first step (resumed too; a spec deciding it)
    val_at_end: bool = False  # the last step validates (a spec whose last step may wake for validation only)
    save_on_early_stop: bool | None = None  # None: an early stop saves iff the run checkpoints
    data_parallel_rank: int | None = None  # this rank's replica (None: megatron's DP rank, else the torch rank)

    def __post_init__(self) -> None:
        if self.num_steps is not None:
            _check_int("num_steps", self.num_steps, minimum=1)
        _check_int("rank", self.rank, minimum=0)
        _check_int("world_size", self.world_size, minimum=1)
        if self.rank >= self.world_size:
            raise ConfigError("rank", self.rank, f"less than world_size={self.world_size}")
        _check_int("start_step", self.start_step, minimum=0)
        _check_int("start_weight_version", self.start_weight_version, minimum=0)
        if self.data_parallel_rank is not None:
            _check_int("data_parallel_rank", self.data_parallel_rank, minimum=0)
        if self.num_steps is not None and self.start_step >= self.num_steps:
            raise ConfigError("start_step", self.start_step, f"less than num_steps={self.num_steps}")
        for name in ("async_training", "val_at_start", "val_at_end"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")
        if self.save_on_early_stop is not None and not isinstance(self.save_on_early_stop, bool):
            raise ConfigError("save_on_early_stop", self.save_on_early_stop, "True, False or None")
        if (
            isinstance(self.progress_interval_s, bool)
            or not isinstance(self.progress_interval_s, int | float)
            or not self.progress_interval_s > 0
        ):
            raise ConfigError("progress_interval_s", self.progress_interval_s, "a positive number of seconds")
        if self.trace_path is not None and not isinstance(self.trace_path, str | Path):
            raise ConfigError("trace_path", self.trace_path, "a file path (str or pathlib.Path) or None")


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


_ENGINE_METHODS = ("bring_up", "suspend", "resume", "shutdown", "server_base_urls")
_TRAINER_METHODS = ("train_step", "offload_buffers", "restore_buffers", "save_checkpoint")
_COLLECTOR_METHODS = ("pause", "resume")


def has_methods(obj: Any, methods: tuple[str, ...]) -> bool:
    """Duck-typed protocol check that also accepts proxies resolving attributes in ``__getattr__``."""
    return obj is not None and all(callable(getattr(obj, m, None)) for m in methods)


def check_arguments(
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
    needed: tuple[str, ...] = _ENGINE_METHODS
    if isinstance(spec, LifecycleSpec) and not spec.with_role(Role.BUILD):  # up at construction: nothing to build
        needed = tuple(m for m in _ENGINE_METHODS if m != "bring_up")
    checks: list[tuple[str, Any, bool, str]] = [
        ("engine", engine, has_methods(engine, needed), f"a GenerationEngine ({', '.join(needed)})"),
        ("trainer", trainer, has_methods(trainer, _TRAINER_METHODS), f"a Trainer ({', '.join(_TRAINER_METHODS)})"),
        (
            "collector",
            collector,
            collector is None or has_methods(collector, _COLLECTOR_METHODS),
            "a Collector (pause, resume) or None",
        ),
        ("config", config, config is None or isinstance(config, LifecycleConfig), "a LifecycleConfig or None"),
        ("drain", drain, drain is None or callable(drain), "a callable that drains this rank's device, or None"),
        ("barrier", barrier, barrier is None or has_methods(barrier, ("wait",)), "a Barrier (with wait()) or None"),
        (
            "checkpoint",
            checkpoint,
            checkpoint is None or has_methods(checkpoint, ("decide",)),
            "a LatchedDecision (e.g. CheckpointDecision) or None",
        ),
        (
            "validation",
            validation,
            validation is None or has_methods(validation, ("decide",)),
            "a LatchedDecision (e.g. ValidationDecision) or None",
        ),
        ("spec", spec, isinstance(spec, LifecycleSpec), "a LifecycleSpec"),
    ]
    checks += [(name, fn, fn is None or callable(fn), "a callable or None") for name, fn in callbacks.items()]
    for name, value, ok, expected in checks:
        if not ok:
            raise ConfigError(name, value, expected)


__all__ = ["LifecycleConfig", "LifecycleStatus", "check_arguments", "has_methods"]
