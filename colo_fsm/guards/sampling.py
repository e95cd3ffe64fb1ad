"""One sampling stream per data-parallel replica: the engine's seed offset by its data-parallel rank.

Data-parallel replicas that sample from the same random stream produce the same rollouts for the same prompt:
whole GRPO groups with zero advantage. A :class:`SamplingStream` is what one replica's engine samples from: a
base seed mixed with the data-parallel rank, so every replica draws a stream of its own while the ranks of
one replica (tensor/pipeline peers, which must sample the same tokens) share it. A seeded request's seed is
mixed with the data-parallel rank the same way (:meth:`SamplingStream.request_seed`). The handoff
fingerprint carries :meth:`SamplingStream.seed` and the data-parallel rank (see
:data:`colo_fsm.guards.fingerprint.SPEC`), so two replicas on one stream are refused at the first barrier.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import ConfigError

_MASK63 = (1 << 63) - 1


def mix_seed(seed: int, dp_rank: int) -> int:
    """A 63-bit seed from ``seed`` and ``dp_rank``: stable, and different for every ``(seed, dp_rank)`` pair
    in practice (so base seeds ``s`` and ``s + 1`` do not swap streams between neighbouring ranks)."""
    raw = hashlib.blake2b(f"{int(seed)}/{int(dp_rank)}".encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big") & _MASK63


@dataclass(frozen=True)
class SamplingStream:
    """The random stream of one data-parallel replica's engine: a base seed and the data-parallel rank."""

    base_seed: int
    dp_rank: int

    def __post_init__(self) -> None:
        for name in ("base_seed", "dp_rank"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(name, v, "a non-negative integer")

    @functools.cached_property
    def seed(self) -> int:
        """The seed of the engine's own generator (the requests that carry no seed sample from it)."""
        return mix_seed(self.base_seed, self.dp_rank)

    def request_seed(self, seed: int) -> int:
        """The generator seed of a request seeded ``seed`` on this replica (another replica draws another)."""
        return mix_seed(seed, self.dp_rank)


@runtime_checkable
class ReportsSamplingStream(Protocol):
    """An engine that declares its sampling stream (optional part of ``GenerationEngine``)."""

    def sampling_stream(self) -> SamplingStream | None:
        """The stream this engine samples from (None: nothing to report)."""


def stream_of(engine: Any) -> SamplingStream | None:
    """``engine.sampling_stream()`` when the engine reports one, else None (such engines are not checked)."""
    fn = getattr(engine, "sampling_stream", None)
    if not callable(fn):
        return None
    stream = fn()
    if stream is not None and not isinstance(stream, SamplingStream):
        raise TypeError(f"{type(engine).__name__}.sampling_stream() returned {type(stream).__name__}")
    return stream


def data_parallel_rank(explicit: int | None = None, *, default: int = 0) -> int:
    """``explicit`` when given, else megatron-core's data-parallel rank when its groups are initialized, else the
    ``torch.distributed`` rank (every rank its own replica), else ``default``."""
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 0:
            raise ConfigError("data_parallel_rank", explicit, "a non-negative integer or None (detect it)")
        return explicit
    try:
        from megatron.core import parallel_state as ps

        if ps.model_parallel_is_initialized():
            return int(ps.get_data_parallel_rank())
    except ImportError:  # megatron-core is optional for this module
        pass
    import torch.distributed as dist

    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else default


__all__ = ["ReportsSamplingStream", "SamplingStream", "data_parallel_rank", "mix_seed", "stream_of"]
