"""What the lifecycle machine counted over every program run in this process (for reports and CI assertions)."""

from __future__ import annotations

import collections
import threading

STATS: collections.Counter[str] = collections.Counter()
"""Counts over every lifecycle machine run in this process: programs, steps, faults fired, ... (for reports)."""
_STATS_LOCK = threading.Lock()


def count(key: str, n: int = 1) -> None:
    """Add ``n`` to :data:`STATS` ``[key]``."""
    with _STATS_LOCK:
        STATS[key] += n


def stats_snapshot() -> dict[str, int]:
    """A copy of :data:`STATS`."""
    with _STATS_LOCK:
        return dict(STATS)


__all__ = ["STATS", "count", "stats_snapshot"]
