"""Collector metrics: buffer size, trajectory age, evicted-as-stale count, time in each state per step.

Log them with :class:`colo_fsm.metrics.MetricsLogger`, which writes consumed samples against elapsed
wall-clock seconds::

    logger.log(step, step_metrics(buffer, collector, lc.trace.records), consumed_samples=n)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from colo_fsm.machine.trace import TraceRecord

if TYPE_CHECKING:
    from colo_fsm.collector.buffer import ReplayBuffer
    from colo_fsm.collector.collector import AsyncCollector

_STEP_END_TRIGGERS = ("resume", "end_validation")


def state_times_per_step(records: Iterable[TraceRecord], rank: int | None = None) -> list[dict[str, float]]:
    """Seconds spent in each state, per training step, from a lifecycle trace (one rank's records).

    A state is occupied from the ``t_enter`` of the record entering it to the ``t_enter`` of the next
    record (its entry actions count towards it). Step ``k`` runs from the return to Generating after step
    ``k-1`` (the run's start for ``k=0``) to the return to Generating (or Done) after its training; the
    Generating time before ``begin_step`` (waiting for the replay buffer) is thus part of step ``k``. Time
    in the state the machine is in now is not counted. ``rank`` selects one rank of a merged trace.
    """
    recs = [r for r in records if rank is None or r.rank == rank]
    recs.sort(key=lambda r: (r.rank, r.seq))
    if recs and rank is None and len({r.rank for r in recs}) > 1:
        recs = [r for r in recs if r.rank == recs[0].rank]
    steps: list[dict[str, float]] = [{}]
    prev: TraceRecord | None = None
    for r in recs:
        if prev is not None:
            bucket = steps[-1]
            bucket[prev.dest] = bucket.get(prev.dest, 0.0) + max(0.0, r.t_enter - prev.t_enter)
        prev = r
        # the step ends once the machine is back in Generating (or Done); later time goes to the next step
        if r.dest == "Done" or (r.dest == "Generating" and r.trigger in _STEP_END_TRIGGERS):
            steps.append({})
    if steps and not steps[-1]:
        steps.pop()
    return steps


def state_time_metrics(times: dict[str, float], prefix: str = "time/") -> dict[str, float]:
    """``{"time/Training_s": 0.12, ...}`` from one entry of :func:`state_times_per_step`."""
    return {f"{prefix}{state}_s": float(seconds) for state, seconds in sorted(times.items())}


def step_metrics(
    buffer: ReplayBuffer | None = None,
    collector: AsyncCollector | None = None,
    trace: Sequence[TraceRecord] | None = None,
    step: int | None = None,
) -> dict[str, float]:
    """Buffer stats (size, average age, evicted as stale), collector counters and, from ``trace``, the time in
    each state of ``step`` (default: the last complete step)."""
    out: dict[str, float] = {}
    if buffer is not None:
        out.update(buffer.stats().as_metrics())
    if collector is not None:
        out.update(collector.stats().as_metrics())
    if trace:
        per_step = state_times_per_step(trace)
        if per_step:
            idx = len(per_step) - 1 if step is None else step
            if 0 <= idx < len(per_step):
                out.update(state_time_metrics(per_step[idx]))
    return out


__all__ = ["state_time_metrics", "state_times_per_step", "step_metrics"]
