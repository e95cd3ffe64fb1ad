"""What the tests of ``bench/handoff_model.py`` and its prices share: where the committed runs are, and the
model's prices at a cut as its command builds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import handoff_model as hm

RUNS = Path(__file__).resolve().parent.parent.parent / "docs" / "gpu-runs"
"""The committed GPU runs the model is held to."""


def model_timing(baseline: hm.Baseline, shape: hm.Shape, seed: int, **costs: Any) -> hm.Timing:
    """The model's prices at ``shape``'s cut, as the command builds them: the table at the workload's mean decode
    context (where a long-context price starts), and any other ``costs`` (``Timing``'s fields, checked there)."""
    context = hm.workload_context(shape, seed)
    return hm.Timing(baseline.table_at(context), kv_from=context, **costs)
