"""One training step of the replay-buffer protocol tests: generate until the buffer can sample, then sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def generate_then_sample(
    buffer: Any, version: int, start: Callable[[], bool], finish: Callable[[], None], has_in_flight: Callable[[], bool]
) -> list[Any]:
    """Start rollouts (or, when none is admitted, finish one) until ``buffer`` can sample a step at ``version``;
    then sample it and check what every step must hold: ``num_prompts_per_step`` groups, none older than
    ``max_trajectory_age_steps``, none trained after its ticket's step. Asserts there is never a deadlock."""
    n, max_age = buffer.num_prompts_per_step, buffer.max_trajectory_age_steps
    while buffer.ready(version) < n:  # generating until the step can sample: must not starve
        if not start():
            assert has_in_flight(), f"deadlock: nothing admitted, nothing in flight, {buffer.ready(version)} < {n}"
            finish()
    batch = buffer.sample(version, timeout=0)
    assert len(batch) == n and all(0 <= g.age(version) <= max_age for g in batch)
    assert all(g.target_step is not None and g.target_step >= version for g in batch)
    return batch
