"""Stopping the demo on SIGTERM / SIGINT: cleanly, on every rank at the same step, with a checkpoint on SIGTERM.

* :class:`StopSignals` (each rank) records the signal; the main loop reads it at the next step boundary.
* :class:`StopAgreement` turns each rank's signal into the world's, one small all-reduce (MAX) per step on a gloo
  group, so every rank stops after the same step (a rank that stopped alone would leave the others waiting in
  the next handoff barrier).
* :func:`run_ranks_forwarding_signals` (the parent of ``--ranks N``) forwards SIGTERM / SIGINT to its ranks,
  waits for them (bounded), and returns the signal it got, so the caller prints the summary and exits
  128 + signum.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from colo_fsm.errors import RanksDidNotStop
from colo_fsm.log import get_logger

log = get_logger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Records SIGTERM / SIGINT; restores the previous handlers on :meth:`close`. Only on the main thread.

    ``escalate`` (a run in this process): a second signal while stopping is left to its default action. A rank
    of a multi-rank run passes False: the parent forwards every signal it gets and a cluster may also signal the
    ranks themselves, so a repeat is not a request to hurry; the parent escalates instead (it kills its ranks).
    """

    def __init__(self, *, escalate: bool = True, rank: int = 0) -> None:
        self.signum: int | None = None
        self.escalate = escalate
        self.rank = rank
        self._old: dict[int, Any] = {}

    def install(self) -> StopSignals:
        """Install the handlers (a no-op off the main thread); returns self."""
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            if not self.escalate:
                log.warning("rank %d: %s again: already stopping", self.rank, signal.Signals(signum).name)
                return
            signal.signal(signum, signal.SIG_DFL)  # asked twice: stop now
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        log.warning("rank %d: %s: stopping at the next step boundary", self.rank, signal.Signals(signum).name)

    def close(self) -> None:
        """Restore the handlers that were there before :meth:`install`."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


class StopAgreement:
    """The world's stop signal at a step boundary: the largest signal number any rank got (0: none).

    With one rank it is this rank's own signal. With more, every rank calls :meth:`agree` once per step, in
    the same order (an all-reduce on ``group``, a gloo group: CPU tensors on any backend).
    """

    def __init__(self, signals: StopSignals, group: Any = None, world: int = 1) -> None:
        self.signals = signals
        self.group = group
        self.world = world
        self.signum = 0  # the world's answer at the latest agree()
        self._held: list[Any] = []  # the last all-reduce's work handle (see colo_fsm.guards.barrier.wait_for)

    def agree(self) -> int:
        """Every rank's signal, combined (MAX); remembered in :attr:`signum` (a signal once agreed stays)."""
        self.signum = max(self.signum, self._world_max(self.signals.signum or 0))
        return self.signum

    def agree_any(self, value: bool) -> bool:
        """True on every rank when any rank passes True (the checkpoint decision's ``agree`` for its stop rule)."""
        return bool(self._world_max(int(bool(value))))

    def _world_max(self, value: int) -> int:
        """The largest ``value`` any rank passed (this rank's own with one rank)."""
        if self.world == 1:
            return value
        import torch
        import torch.distributed as dist

        from colo_fsm.guards.barrier import wait_for

        t = torch.tensor([value], dtype=torch.int64)
        self._held = [wait_for(dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True))]
        return int(t.item())


def run_ranks_forwarding_signals(start: Callable[[], Any], *, stop_timeout_s: float, poll_s: float = 0.2) -> int | None:
    """Run ``start()`` (a ``torch.multiprocessing`` context with ``join(timeout)`` and ``processes``) to its end.

    SIGTERM / SIGINT to this process are forwarded to every rank still alive, and the ranks get
    ``stop_timeout_s`` to stop; past it, or on a second signal, they are killed and :class:`RanksDidNotStop`
    is raised. Returns the signal this process got (None when none).
    """
    got: dict[str, Any] = {"signum": None, "again": False}
    ctx: Any = None

    def forward(signum: int, _frame: Any) -> None:
        if got["signum"] is not None:  # a second signal: the loop below kills the ranks (not forwarded)
            got["again"] = True
            return
        got["signum"] = signum
        for p in getattr(ctx, "processes", []):
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)

    old = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        ctx = start()
        if got["signum"] is not None:  # it came while the ranks were being started: they get it now
            for p in ctx.processes:
                if p.is_alive() and p.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, got["signum"])
        deadline: float | None = None
        while not ctx.join(timeout=poll_s):
            if got["signum"] is not None and deadline is None:
                deadline = time.monotonic() + stop_timeout_s
                log.warning(
                    "%s: forwarded to %d rank(s); waiting up to %.0f s for them to stop",
                    signal.Signals(got["signum"]).name,
                    len(ctx.processes),
                    stop_timeout_s,
                )
            if got["again"] or (deadline is not None and time.monotonic() > deadline):
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                for p in ctx.processes:
                    p.join(10)
                why = "a second signal" if got["again"] else f"stop_timeout_s={stop_timeout_s:g}"
                raise RanksDidNotStop(f"the ranks were killed ({why}) before they stopped; see the run folder's logs")
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    return got["signum"]


__all__ = ["STOP_SIGNALS", "StopAgreement", "StopSignals", "run_ranks_forwarding_signals"]
