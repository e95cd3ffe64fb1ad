"""A colocated engine inherits the training model's parallelism; a generation-side setting cannot apply."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from colo_fsm.errors import ConfigError, ParallelismMismatch
from colo_fsm.log import get_logger

log = get_logger(__name__)

WEIGHT_SHARDING_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
"""Settings that shard weights: a mismatch raises."""

ACTIVATION_SHARDING_FIELDS = ("context_parallel_size",)
"""Settings that shard activations only: a mismatch warns (it still cannot apply)."""

_ALIASES = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "cp": "context_parallel_size",
}


class ParallelismWarning(UserWarning):
    """A generation-side setting that cannot take effect but does not break correctness."""


@dataclass(frozen=True)
class ParallelismCheck:
    """The outcome of :func:`check_parallelism`: the settings compared and the warnings raised."""

    compared: tuple[str, ...]
    warnings: tuple[str, ...]


_SCALARS = (bool, int, float, str, bytes)


def read_parallel_size(config: Any, name: str, which: str) -> int | None:
    """``config``'s parallel size ``name`` (a megatron-core config object's attribute, or a mapping's full name or
    short alias, e.g. ``ep``); None where unset; a :class:`ConfigError` naming ``which.name`` for anything but a
    positive integer."""
    if isinstance(config, Mapping):
        value = config.get(name)
        if value is None:
            short = next((k for k, v in _ALIASES.items() if v == name), None)
            value = config.get(short) if short else None
    else:
        value = getattr(config, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{which}.{name}", value, "a positive integer")
    return value


def check_parallelism(training: Any, generation: Any) -> ParallelismCheck:
    """Compare generation-side parallelism with the training model's.

    ``training`` and ``generation`` may be megatron-core ``TransformerConfig``/``ModelParallelConfig``
    objects or plain mappings (full names or ``tp``/``pp``/``ep``/``etp``/``cp``). Unset generation fields
    inherit; an expert tensor parallel size of None on the training side defaults to TP, as in megatron-core.
    Raises :class:`ParallelismMismatch` for TP/PP/EP/ETP; warns (``ParallelismWarning``) for CP.
    """
    if training is None or isinstance(training, _SCALARS):
        raise ConfigError("training_config", training, "a TransformerConfig or a mapping of parallel sizes")
    if generation is None:
        return ParallelismCheck((), ())
    if isinstance(generation, _SCALARS):
        raise ConfigError("generation_config", generation, "None, a config object or a mapping of parallel sizes")
    compared: list[str] = []
    warned: list[str] = []
    for name in (*WEIGHT_SHARDING_FIELDS, *ACTIVATION_SHARDING_FIELDS):
        gen = read_parallel_size(generation, name, "generation")
        if gen is None:
            continue
        train = read_parallel_size(training, name, "training")
        if train is None and name == "expert_tensor_parallel_size":
            train = read_parallel_size(training, "tensor_model_parallel_size", "training")
        train = 1 if train is None else train
        compared.append(name)
        if gen == train:
            continue
        if name in WEIGHT_SHARDING_FIELDS:
            raise ParallelismMismatch(name, training=train, generation=gen)
        msg = (
            f"{name}: generation asks for {gen} but the colocated engine inherits the training "
            f"{name}={train}; it shards activations, not weights, so it is ignored"
        )
        warnings.warn(msg, ParallelismWarning, stacklevel=2)
        log.warning(msg)
        warned.append(msg)
    return ParallelismCheck(tuple(compared), tuple(warned))


__all__ = [
    "ACTIVATION_SHARDING_FIELDS",
    "WEIGHT_SHARDING_FIELDS",
    "ParallelismCheck",
    "ParallelismWarning",
    "check_parallelism",
    "read_parallel_size",
]
