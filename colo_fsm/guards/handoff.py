"""Per-rank bookkeeping of collective work on the shared communicator, read by the handoff guard.

The ledger records which kinds of collective work this rank has put on its device since its last drain,
which phase issued last, and whether this rank drained and then met every peer at a barrier since. It lets
the machine refuse, at run time, any action that would start a new phase (decode after training, a save
after decode, ...) before the handoff completed, and refuse a barrier before this rank's drain.
"""

from __future__ import annotations

from colo_fsm.errors import LifecycleError
from colo_fsm.states.spec import Collective


class HandoffLedger:
    """Drain-then-barrier bookkeeping for one rank."""

    def __init__(self) -> None:
        self.phase: Collective | None = None  # kind of collective work issued last
        self.dirty: set[Collective] = set()  # kinds issued since the last drain of the own device
        self.drained = True
        self.complete = False  # drained, then barrier, since the last issue

    def issue(self, kind: Collective) -> None:
        """Record that an action is about to put ``kind`` work on the device; refuse an unsafe phase switch."""
        leftover = self.dirty - {kind}
        if leftover:
            names = ", ".join(sorted(k.value for k in leftover))
            raise LifecycleError(
                f"{kind.value} work would start while {names} work is still on this device "
                "(drain the own device and meet the barrier first)"
            )
        if self.phase is not None and self.phase != kind and not self.complete:
            raise LifecycleError(
                f"{kind.value} work would start after {self.phase.value} work without a "
                "completed handoff (drain own device, then barrier)"
            )
        self.phase = kind
        self.dirty.add(kind)
        self.drained = False
        self.complete = False

    def record_drain(self) -> None:
        """This rank's own device is idle."""
        self.dirty.clear()
        self.drained = True

    def before_barrier(self) -> None:
        """Refuse a barrier before this rank drained its own device."""
        if not self.drained:
            names = ", ".join(sorted(k.value for k in self.dirty))
            raise LifecycleError(
                f"barrier reached with {names} work still on this device: drain the device "
                "named by LOCAL_RANK before the barrier"
            )

    def record_barrier(self) -> None:
        """Every rank met the barrier after draining."""
        self.complete = self.drained

    def snapshot(self) -> dict[str, object]:
        """A JSON-friendly view for traces and errors."""
        return {
            "phase": self.phase.value if self.phase else None,
            "dirty": sorted(k.value for k in self.dirty),
            "drained": self.drained,
            "complete": self.complete,
        }


__all__ = ["HandoffLedger"]
