"""Barriers over a process group, with a timeout whose failure names state, rank and timeout.

:class:`TorchBarrier` and :class:`ThreadBarrier` also exchange a
:class:`~colo_fsm.guards.fingerprint.HandoffFingerprint` as the barrier itself when one is passed
(``exchanges_fingerprints``): one small collective instead of a barrier, and on a mismatch every rank raises
:class:`~colo_fsm.errors.HandoffDivergence` within that barrier.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import BarrierTimeout, ConfigError
from colo_fsm.guards.fingerprint import HandoffFingerprint, divergence, mode_record, rows_pass


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
    world_size = 1
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
    """A ``torch.distributed`` barrier over ``group`` with a timeout counted from this rank's arrival.

    Without a fingerprint: a ``barrier`` work handle carrying the deadline as its own timeout (gloo's
    ``monitored_barrier`` is not used: a non-zero rank waiting for a live but silent rank 0 overstays its
    timeout there). With one, the fingerprint exchange *is* the barrier: one
    collective of one int64 per :data:`~colo_fsm.guards.fingerprint.SPEC` field per rank, after which every
    rank holds every rank's row and compares the same rows. On CPU tensors (gloo) it is an all-to-all of this
    rank's row (one round: every message in flight at once, where gloo's all_gather is a ring of
    ``world - 1`` rounds), on ``device`` (NCCL; default ``cuda:LOCAL_RANK``, never the calling thread's current
    device) an all_gather. The collective carries the barrier's own deadline as its timeout, so gloo closes
    its connections when it expires and a rank arriving after its peers gave up fails at once instead of
    passing on their stale rows; the caller waits on the work handle with the same deadline. On a mode-digest
    mismatch the ranks, all together, also all_gather their mode records to name the differing mode fields.
    On timeout raises :class:`BarrierTimeout` naming the state, this rank and the timeout; when a rule of the
    fingerprint is broken every rank raises :class:`~colo_fsm.errors.HandoffDivergence`.
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
        if self.rank < 0:
            raise ConfigError("process_group", group, "a group this rank belongs to")
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        if device is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if self.backend == "nccl" else "cpu"
        self.device = torch.device(device)
        self._dist = dist
        self._torch = torch
        self._bufs: tuple[Any, Any, Any] | None = None
        # The last exchange's work handle, kept until the next one (see _exchange).
        self._last_work: Any = None
        self._peers = [r for r in range(self.world_size) if r != self.rank]

    @property
    def _pg(self) -> Any:
        """The group's process group, looked up per call: holding the default group would keep it alive past
        ``destroy_process_group`` (its gloo threads then outlive it into interpreter shutdown)."""
        return self.group if self.group is not None else self._dist.group.WORLD

    def _exchange(self, fingerprint: HandoffFingerprint, deadline: float) -> list[list[int]]:
        """Every rank's wire row (the rows every rank checks), from one exchange bounded by ``deadline``."""
        ints = fingerprint.to_ints()
        if self.world_size == 1:  # nobody to meet: the one row always agrees
            return [ints]
        n = len(ints)
        send, recv, host = self._buffers(n)
        if self.device.type == "cpu":
            host[:] = ints  # a numpy view of ``send``
            pg, peers = self._pg, self._peers
            # receives first, so every peer's row has a place to land before any row is on the wire
            works = [pg.recv([recv[p * n : (p + 1) * n]], p, _FINGERPRINT_TAG) for p in peers]
            works += [pg.send([send], p, _FINGERPRINT_TAG) for p in peers]
            # point-to-point messages carry no timeout of their own: the deadline bounds the wait itself, and
            # gloo's wait returns once the message is through (no polling after it)
            for work in works:
                if work.wait(timeout=_left(deadline)) is False:
                    raise TimeoutError("the exchange did not complete within the barrier's deadline")
        else:
            from torch.distributed.distributed_c10d import AllgatherOptions

            send.copy_(self._torch.tensor(ints, dtype=self._torch.int64))
            opts = AllgatherOptions()
            opts.timeout = _left(deadline)
            opts.asyncOp = True
            works = [self._pg._allgather_base(recv, send, opts)]
            _await(works[0], deadline)
        # A work handle's last release frees tensors Python made, which takes the GIL. A backend thread that
        # releases its own handle after completing the work (gloo's worker thread does, for a collective) would
        # abort the process were its release the last one and land in interpreter shutdown ("terminate called
        # without an active exception"). Holding ours until the next exchange makes the last release this
        # thread's.
        self._last_work = works
        flat = recv.tolist()
        rows = [flat[i * n : (i + 1) * n] for i in range(self.world_size)]
        rows[self.rank] = ints  # (on the CPU its slot in ``recv`` stays empty: a rank sends itself nothing)
        return rows

    def _buffers(self, n: int) -> tuple[Any, Any, Any]:
        """The send and receive tensors of an ``n``-field exchange (and the send tensor's numpy view on the
        CPU), allocated once: a fresh pair per barrier costs gloo about as much as the exchange itself."""
        if self._bufs is None or self._bufs[0].numel() != n:
            torch = self._torch
            send = torch.empty(n, dtype=torch.int64, device=self.device)
            recv = torch.zeros(n * self.world_size, dtype=torch.int64, device=self.device)
            self._bufs = (send, recv, send.numpy() if self.device.type == "cpu" else None)
        return self._bufs

    def _barrier_work(self, deadline: float) -> Any:
        """A barrier work handle carrying ``deadline`` as its own timeout (on ``device`` for NCCL)."""
        from torch.distributed.distributed_c10d import BarrierOptions

        opts = BarrierOptions()
        opts.timeout = _left(deadline)
        opts.asyncOp = True
        if self.device.type == "cuda":
            opts.device_ids = [self.device.index if self.device.index is not None else 0]
        return self._pg.barrier(opts)

    def _exchange_modes(self, fingerprint: HandoffFingerprint) -> list[dict[str, Any] | None]:
        import torch
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            dist.all_gather_object(out, mode_record(fingerprint), group=self.group)
        return out

    def wait(
        self,
        *,
        state: str | None = None,
        weight_version: int | None = None,
        fingerprint: HandoffFingerprint | None = None,
    ) -> None:
        deadline = time.monotonic() + self.timeout_s  # counted from this rank's arrival
        if fingerprint is not None:
            try:
                gathered = self._exchange(fingerprint, deadline)
            except Exception as exc:  # torch raises RuntimeError/DistBackendError on a timeout or a closed peer
                raise BarrierTimeout(
                    self.timeout_s, state=state, rank=self.rank, weight_version=weight_version, detail=str(exc)
                ) from exc
            if rows_pass(gathered):  # the fast path: integer comparisons only
                return
            fps = [HandoffFingerprint.from_ints(row) for row in gathered]
            err = divergence(fps, rank=self.rank)
            if err is not None and "mode_digest" in err.fields:  # every rank got the same rows: all are here
                err = divergence(fps, rank=self.rank, modes=self._exchange_modes(fingerprint))
            if err is not None:
                raise err
            return
        try:
            _await(self._barrier_work(deadline), deadline)
        except Exception as exc:  # torch raises RuntimeError/DistBackendError on timeout
            raise BarrierTimeout(
                self.timeout_s, state=state, rank=self.rank, weight_version=weight_version, detail=str(exc)
            ) from exc


def wait_for(work: Any) -> Any:
    """Wait for a collective's work handle (None where this rank is not in the group) and return it, for the caller
    to hold until its next collective: see :meth:`TorchBarrier._exchange` on why the last release must be the
    caller's."""
    if work is not None:
        work.wait()
    return work


def _left(deadline: float) -> timedelta:
    return timedelta(seconds=max(deadline - time.monotonic(), 1e-3))


# The tag of the fingerprint's point-to-point messages on gloo; a user's own send/recv on the same group should
# not use it.
_FINGERPRINT_TAG = 0x0C0F5

_GRACE_S = 0.5  # the collective's own timeout (the deadline) fires first; this wait backs it up


def _await(work: Any, deadline: float) -> None:
    """Wait for ``work``, which carries ``deadline`` (monotonic) as its own timeout; raise TimeoutError past it.

    gloo's and NCCL's ``wait(timeout)`` block the CPU until the work completed or raise at the timeout. This
    wait ends a moment after the collective's own timeout, so that it is the collective that gives up (gloo
    then closes its connections: a late peer fails instead of completing the abandoned exchange), and at most
    ``_GRACE_S`` after the deadline where it does not. A backend whose ``wait`` only orders streams is polled.
    """
    if work is None:
        return
    end = deadline + _GRACE_S
    if work.wait(timeout=_left(end)) is False:
        raise TimeoutError("the exchange did not complete within the barrier's deadline")
    while not work.is_completed():
        if time.monotonic() >= end:
            raise TimeoutError("the exchange did not complete within the barrier's deadline")
        time.sleep(1e-4)


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
        self.world_size = shared.parties
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
