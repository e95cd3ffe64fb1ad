"""Barriers over a process group, with a timeout whose failure names state, rank and timeout.

:class:`TorchBarrier` and :class:`ThreadBarrier` also exchange a
:class:`~colo_fsm.guards.fingerprint.HandoffFingerprint` as the barrier itself when one is passed
(``exchanges_fingerprints``): one small collective instead of a barrier, and on a mismatch every rank raises
:class:`~colo_fsm.errors.HandoffDivergence` within that barrier.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import BarrierTimeout, ConfigError
from colo_fsm.guards.fingerprint import HandoffFingerprint, divergence, mode_record


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
    """The barrier of a world of one rank: returns at once (a fingerprint of one rank always agrees)."""

    rank = 0
    exchanges_fingerprints = True

    def wait(
        self,
        *,
        state: str | None = None,
        weight_version: int | None = None,
        fingerprint: HandoffFingerprint | None = None,
    ) -> None:
        return None


class TorchBarrier:
    """A ``torch.distributed`` barrier over ``group`` with a timeout.

    Without a fingerprint: ``monitored_barrier`` on gloo (which names the missing ranks) and a ``barrier`` on
    a work handle with ``wait(timeout)`` elsewhere. With one, the fingerprint exchange *is* the barrier
    (seven int64 values per rank): on gloo every rank sends its row to rank 0, which answers each with the
    whole table (the two steps of ``monitored_barrier``, with its property that a rank arriving after rank 0
    gave up times out as well); on NCCL one all-to-all on ``device`` (default ``cuda:LOCAL_RANK``, never the
    calling thread's current device). Every rank compares the same rows; on a mode-digest mismatch the ranks,
    all together, also all_gather their mode records to name the differing mode fields. On timeout raises :class:`BarrierTimeout` naming the state, this rank
    and the timeout; on a fingerprint mismatch every rank raises :class:`~colo_fsm.errors.HandoffDivergence`.
    """

    exchanges_fingerprints = True

    def __init__(self, group: Any = None, *, timeout_s: float = 600.0, device: Any = None) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("process_group", group, "an initialized torch.distributed process group")
        self.group = group
        self.timeout_s = _check_timeout(timeout_s)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        if device is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if self.backend == "nccl" else "cpu"
        self.device = torch.device(device)

    def _complete(self, work: Any, deadline: float | None = None) -> None:
        left = self.timeout_s if deadline is None else max(deadline - time.monotonic(), 1e-3)
        if work is not None and not work.wait(timeout=timedelta(seconds=left)):
            raise TimeoutError("fingerprint exchange did not complete")

    def _exchange(self, fingerprint: HandoffFingerprint) -> list[HandoffFingerprint]:
        """Every rank's fingerprint (the rows every rank compares)."""
        import torch

        ints = fingerprint.to_ints()
        n = len(ints)
        if self.backend == "gloo":
            table = self._via_root(torch.tensor(ints, dtype=torch.int64))
        else:
            table = self._all_to_all(torch.tensor(ints, dtype=torch.int64, device=self.device))
        flat = table.reshape(-1).tolist()
        return [HandoffFingerprint.from_ints(flat[i * n : (i + 1) * n]) for i in range(self.world_size)]

    def _via_root(self, mine: Any) -> Any:
        """gloo: every rank sends its row to rank 0, which answers each with the whole table.

        Like ``monitored_barrier`` (two steps): rank 0 must actively answer, so a rank that arrives after rank 0
        gave up times out too instead of passing on a contribution rank 0 left behind.
        """
        import torch
        import torch.distributed as dist

        deadline = time.monotonic() + self.timeout_s
        table = torch.empty((self.world_size, mine.numel()), dtype=torch.int64)
        if self.rank == 0:
            table[0] = mine
            recvs = [dist.irecv(table[i], group=self.group, group_src=i) for i in range(1, self.world_size)]
            for w in recvs:
                self._complete(w, deadline)
            for w in [dist.isend(table, group=self.group, group_dst=i) for i in range(1, self.world_size)]:
                self._complete(w, deadline)
        else:
            answer = dist.irecv(table, group=self.group, group_src=0)  # posted first: both are in flight at once
            self._complete(dist.isend(mine, group=self.group, group_dst=0), deadline)
            self._complete(answer, deadline)
        return table

    def _all_to_all(self, mine: Any) -> Any:
        """NCCL: one all-to-all of this rank's row to every peer (every rank receives every row at once)."""
        import torch
        import torch.distributed as dist

        send = mine.repeat(self.world_size)
        rows = torch.empty_like(send)
        self._complete(dist.all_to_all_single(rows, send, group=self.group, async_op=True))
        return rows.cpu()

    def _exchange_modes(self, fingerprint: HandoffFingerprint) -> list[dict[str, Any] | None]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mode_record(fingerprint), group=self.group)
        return out

    def wait(
        self,
        *,
        state: str | None = None,
        weight_version: int | None = None,
        fingerprint: HandoffFingerprint | None = None,
    ) -> None:
        import torch.distributed as dist

        timeout = timedelta(seconds=self.timeout_s)
        if fingerprint is not None:
            try:
                gathered = self._exchange(fingerprint)
                err = divergence(gathered, rank=self.rank)
                if err is not None and "mode_digest" in err.fields:  # every rank got the same rows: all are here
                    err = divergence(gathered, rank=self.rank, modes=self._exchange_modes(fingerprint))
            except Exception as exc:
                raise BarrierTimeout(
                    self.timeout_s, state=state, rank=self.rank, weight_version=weight_version, detail=str(exc)
                ) from exc
            if err is not None:
                raise err
            return
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

    Create one :class:`threading.Barrier` for all ranks and one ``ThreadBarrier`` per rank around it. With a
    fingerprint, the ranks exchange it through slots shared by everyone around the same ``threading.Barrier``.
    """

    exchanges_fingerprints = True

    def __init__(self, shared: threading.Barrier, rank: int, *, timeout_s: float = 60.0) -> None:
        if not isinstance(shared, threading.Barrier):
            raise ConfigError("shared", shared, "a threading.Barrier shared by every rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < shared.parties:
            raise ConfigError("rank", rank, f"an integer in [0, {shared.parties})")
        self.shared = shared
        self.rank = rank
        self.timeout_s = _check_timeout(timeout_s)

    def wait(
        self,
        *,
        state: str | None = None,
        weight_version: int | None = None,
        fingerprint: HandoffFingerprint | None = None,
    ) -> None:
        try:
            if fingerprint is None:
                self.shared.wait(timeout=self.timeout_s)
                return
            slots = _slots(self.shared)
            slots[self.rank] = fingerprint
            self.shared.wait(timeout=self.timeout_s)
            gathered = list(slots)
            self.shared.wait(timeout=self.timeout_s)  # nobody overwrites a slot before every rank read them all
        except threading.BrokenBarrierError as exc:
            raise BarrierTimeout(
                self.timeout_s,
                state=state,
                rank=self.rank,
                weight_version=weight_version,
                detail="a peer timed out or left",
            ) from exc
        fps = [fp if fp is not None else HandoffFingerprint("<absent>", -1, -1) for fp in gathered]
        err = divergence(fps, rank=self.rank, modes=[mode_record(fp) for fp in gathered])
        if err is not None:
            raise err


_SLOTS: weakref.WeakKeyDictionary[threading.Barrier, list[HandoffFingerprint | None]] = weakref.WeakKeyDictionary()
_SLOTS_LOCK = threading.Lock()


def _slots(shared: threading.Barrier) -> list[HandoffFingerprint | None]:
    with _SLOTS_LOCK:
        slots = _SLOTS.get(shared)
        if slots is None:
            slots = _SLOTS[shared] = [None] * shared.parties
        return slots


__all__ = ["Barrier", "SoloBarrier", "ThreadBarrier", "TorchBarrier"]
