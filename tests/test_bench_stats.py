"""bench/_stats.py: the percentile, median and range every bench quotes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._stats import median, minmax, pct  # noqa: E402


def test_pct_is_the_nearest_rank_of_the_sorted_values():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]  # unsorted on purpose
    assert [pct(xs, q) for q in (0, 25, 50, 75, 100)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert pct([7.0], 99) == 7.0
    assert pct([1.0, 2.0], 75) == 2.0  # the nearest rank, not the one below
    assert pct(range(101), 90) == 90  # any sequence, not only a list
    assert xs == [5.0, 1.0, 4.0, 2.0, 3.0]  # the caller's list is not sorted in place


def test_no_data_gives_nan_not_an_error():
    assert math.isnan(pct([], 50)) and math.isnan(median([]))
    assert median([3.0, 1.0, 2.0, 10.0]) == 2.5


def test_minmax_is_a_json_range_or_none():
    assert minmax([40, 32, 63]) == [32, 63] and minmax(range(3)) == [0, 2] and minmax([]) is None
