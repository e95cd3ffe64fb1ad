"""The summaries every bench quotes: a nearest-rank percentile and a median, each NaN for no data, and a range;
and the table cell that prints no data as ``-``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ``xs``; NaN for an empty sequence."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))]


def median(xs: Sequence[float]) -> float:
    """The median of ``xs``; NaN for an empty sequence."""
    return statistics.median(xs) if xs else float("nan")


def cell(x: Any, spec: str = "{:.2f}") -> str:
    """``x`` formatted for a table, or ``-`` where there was nothing to measure (None, or the NaN of no data)."""
    return "-" if x is None or (isinstance(x, float) and x != x) else spec.format(x)


def minmax(xs: Sequence[int]) -> list[int] | None:
    """``[min, max]`` of ``xs`` (a list, for JSON); None for an empty sequence."""
    return [min(xs), max(xs)] if xs else None
