"""Barriers over a process group, with a timeout whose failure names state, rank and timeout."""

from __future__ import annotations

import math
import threading
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import BarrierTimeout, ConfigError


@runtime_checkable
class Barrier(Protocol):
    """Every rank calls :meth:`wait`; it returns once all have, or raises :class:`BarrierTimeout`."""

    def wait(self, *, state: str | None = None, weight_version: int | None = None) -> None:
        """Block until every rank of the group has arrived."""


def _check_timeout(timeout_s: float) -> float:
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or not 0 < timeout_s < math.inf:
        raise ConfigError("barrier_timeout_s", timeout_s, "a positive finite number of seconds")
    return float(timeout_s)


class SoloBarrier:
    """The barrier of a world of one rank: returns at once."""

    rank = 0

    def wait(self, *, state: str | None = None, weight_version: int | None = None) -> None:
        return None


class TorchBarrier:
    """A ``torch.distributed`` barrier over ``group`` with a timeout.

    Uses ``monitored_barrier`` on gloo (which names the missing ranks) and a ``barrier`` on a work handle
    with ``wait(timeout)`` elsewhere. On timeout raises :class:`BarrierTimeout` naming the state, this rank
    and the timeout.
    """

    def __init__(self, group: Any = None, *, timeout_s: float = 600.0) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("process_group", group, "an initialized torch.distributed process group")
        self.group = group
        self.timeout_s = _check_timeout(timeout_s)
        self.rank = dist.get_rank(group)

    def wait(self, *, state: str | None = None, weight_version: int | None = None) -> None:
        import torch.distributed as dist

        timeout = timedelta(seconds=self.timeout_s)
        try:
            if dist.get_backend(self.group) == "gloo":
                dist.monitored_barrier(group=self.group, timeout=timeout, wait_all_ranks=True)
            else:
                work = dist.barrier(group=self.group, async_op=True)
                if work is not None and not work.wait(timeout=timeout):
                    raise TimeoutError("barrier work did not complete")
        except Exception as exc:  # torch raises RuntimeError/DistBackendError on timeout
            raise BarrierTimeout(
                self.timeout_s, state=state, rank=self.rank, weight_version=weight_version, detail=str(exc)
            ) from exc


class ThreadBarrier:
    """Ranks as threads of one process (simulations, tests): a :class:`threading.Barrier` with a timeout.

    Create one :class:`threading.Barrier` for all ranks and one ``ThreadBarrier`` per rank around it.
    """

    def __init__(self, shared: threading.Barrier, rank: int, *, timeout_s: float = 60.0) -> None:
        if not isinstance(shared, threading.Barrier):
            raise ConfigError("shared", shared, "a threading.Barrier shared by every rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < shared.parties:
            raise ConfigError("rank", rank, f"an integer in [0, {shared.parties})")
        self.shared = shared
        self.rank = rank
        self.timeout_s = _check_timeout(timeout_s)

    def wait(self, *, state: str | None = None, weight_version: int | None = None) -> None:
        try:
            self.shared.wait(timeout=self.timeout_s)
        except threading.BrokenBarrierError as exc:
            raise BarrierTimeout(
                self.timeout_s,
                state=state,
                rank=self.rank,
                weight_version=weight_version,
                detail="a peer timed out or left",
            ) from exc


__all__ = ["Barrier", "SoloBarrier", "ThreadBarrier", "TorchBarrier"]
