"""Every request the server hands to the engine, and how it ended: answered, aborted (its client went away and
it was cancelled in the engine) or failed (the engine stopped under it). Each admitted request ends exactly once;
a second ending is counted in ``twice`` (must stay 0), which the chaos test and ``/health`` read."""

from __future__ import annotations

OUTCOMES = ("answered", "aborted", "failed")


class RequestLedger:
    """Admitted requests and their endings, counted on the server's event loop (no lock)."""

    def __init__(self) -> None:
        self.admitted = 0
        self.ended = dict.fromkeys(OUTCOMES, 0)
        self.twice = 0

    def open(self) -> LedgerEntry:
        """Count one request handed to the engine; end it through the returned entry."""
        self.admitted += 1
        return LedgerEntry(self)

    @property
    def open_requests(self) -> int:
        """Admitted requests that have not ended yet."""
        return self.admitted - sum(self.ended.values())

    def counters(self) -> dict[str, int]:
        """Admitted, each ending, still open, and endings recorded twice."""
        return {"admitted": self.admitted, **self.ended, "open": self.open_requests, "ended_twice": self.twice}


class LedgerEntry:
    """One admitted request; :meth:`end` records how it ended (once)."""

    def __init__(self, ledger: RequestLedger) -> None:
        self._ledger = ledger
        self.outcome: str | None = None

    def end(self, outcome: str) -> None:
        """Record the ending ``outcome`` (one of :data:`OUTCOMES`); a second call counts in ``twice``."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r}: expected one of {OUTCOMES}")
        if self.outcome is not None:
            self._ledger.twice += 1
            return
        self.outcome = outcome
        self._ledger.ended[outcome] += 1

    def end_once(self, outcome: str) -> None:
        """:meth:`end` unless an ending was recorded already (for ``finally`` blocks)."""
        if self.outcome is None:
            self.end(outcome)


__all__ = ["OUTCOMES", "LedgerEntry", "RequestLedger"]
