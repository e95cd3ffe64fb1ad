"""The shared model's mode state, declared: every inference-only mutation an engine makes, and its training value.

A colocated engine mutates the *shared* model for decoding (megatron-core's process-wide ``InferenceMode`` flag,
CUDA-graph toggles, decode-time MoE expert padding and capacity, the inference token dispatcher, training hooks
that would issue collectives from decode). :class:`ModelMode` is one snapshot of those switches;
:class:`ModeReport` pairs the current snapshot with the one training needs. Suspend must bring every rank to
the training snapshot identically; :func:`check_training_mode` refuses a training step on a model that is not
there (see :attr:`colo_fsm.states.rules.LifecycleRule.UNIFORM_MODEL_MODE`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import ModelModeError


@dataclass(frozen=True)
class ModelMode:
    """One snapshot of the inference-only switches on the shared model.

    ``None`` means "not applicable to this model" (e.g. no MoE layers, no overlapped param-gather hooks).
    """

    inference_mode: bool = False  # megatron-core InferenceMode.is_active()
    cuda_graph_impl: str = "none"  # config.cuda_graph_impl: "none", "local" or "transformer_engine"
    cuda_graph_managers: int = 0  # modules holding a local CUDA-graph manager (toggle_cuda_graphs removes them)
    expert_padding: bool | None = None  # MoE drop-and-pad (set_decode_expert_padding), None without MoE layers
    expert_capacity_factor: float | None = None  # the router's / dispatchers' capacity factor
    inference_dispatchers: int | None = None  # MoE layers whose active token dispatcher is the inference one
    param_gather_hooks: bool | None = None  # DDP forward pre-hooks (overlapped param all-gather), None without

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON-friendly)."""
        return dataclasses.asdict(self)

    def differences(self, other: ModelMode) -> list[tuple[str, Any, Any]]:
        """``(field, mine, other's)`` for every field whose value differs."""
        a, b = self.as_dict(), other.as_dict()
        return [(k, a[k], b[k]) for k in a if a[k] != b[k]]


@dataclass(frozen=True)
class ModeReport:
    """What an engine reports about the shared model: the current mode and the mode training needs."""

    current: ModelMode
    training: ModelMode

    def off_training(self) -> list[tuple[str, Any, Any]]:
        """``(field, current value, training value)`` for every switch still in an inference position."""
        return self.current.differences(self.training)

    def digest(self) -> int:
        """A 63-bit digest of both snapshots: equal on every rank whose model is in the same mode."""
        return mode_digest(self)


def mode_digest(report: ModeReport | None) -> int:
    """A stable, non-negative 63-bit digest of ``report`` (0 for an engine that reports nothing); cached per
    report value and value types (a frozen snapshot), so a barrier pays for the JSON and hash once per mode."""
    if report is None:
        return 0
    types = tuple(type(v) for m in (report.current, report.training) for v in vars(m).values())
    return _digest(report, types)


@functools.lru_cache(maxsize=256)
def _digest(report: ModeReport, types: tuple[type, ...]) -> int:  # types: 1, 1.0 and True are equal keys
    text = json.dumps([report.current.as_dict(), report.training.as_dict()], sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


@runtime_checkable
class ReportsModelMode(Protocol):
    """An engine that declares the mode of the shared model (optional part of ``GenerationEngine``)."""

    def model_mode(self) -> ModeReport | None:
        """The current and the training mode of the shared model (None: nothing to report)."""


def report_of(engine: Any) -> ModeReport | None:
    """``engine.model_mode()`` when the engine reports one, else None (engines may report nothing)."""
    fn = getattr(engine, "model_mode", None)
    if not callable(fn):
        return None
    report = fn()
    if report is not None and not isinstance(report, ModeReport):
        raise TypeError(f"{type(engine).__name__}.model_mode() returned {type(report).__name__}, not a ModeReport")
    return report


def check_training_mode(
    report: ModeReport | None, *, state: str | None = None, rank: int | None = None, weight_version: int | None = None
) -> None:
    """Refuse (raise :class:`~colo_fsm.errors.ModelModeError`) when any switch is still in an inference position."""
    if report is None:
        return
    off = report.off_training()
    if off:
        raise ModelModeError(off, state=state, rank=rank, weight_version=weight_version)


__all__ = ["ModeReport", "ModelMode", "ReportsModelMode", "check_training_mode", "mode_digest", "report_of"]
