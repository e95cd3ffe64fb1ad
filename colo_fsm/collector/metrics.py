"""Collector metrics: buffer size, trajectory age, evicted-as-stale count, time in each state per step.

Log them with :class:`colo_fsm.metrics.MetricsLogger`, which writes consumed samples against elapsed
wall-clock seconds::

    timer = StateTimer()
    lc.trace.subscribe(timer)          # accumulates incrementally, one record at a time
    ...
    result = lc.step(batch)
    logger.log(step, step_metrics(buffer, collector, times=timer.pop_completed()), consumed_samples=n)

Step boundaries are read from the lifecycle spec and the trace, not from state or trigger names: a step
ends at the first record, after its optimizer step was counted (the record's ``step`` grew), that enters a
state where the spec says the collector runs (collection again) or a final state (the run is over).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from colo_fsm.machine.trace import TraceRecord
from colo_fsm.states.spec import LIFECYCLE, CollectorCondition, LifecycleSpec

if TYPE_CHECKING:
    from colo_fsm.collector.buffer import ReplayBuffer
    from colo_fsm.collector.collector import AsyncCollector


def _step_end_states(spec: LifecycleSpec) -> frozenset[str]:
    """States whose entry (after a counted optimizer step) closes the step: collection resumes there, or the run
    is over."""
    return frozenset(s.state.value for s in spec.states if s.collector is CollectorCondition.RUNNING or s.final)


class StateTimer:
    """Seconds in each state per training step, accumulated one trace record at a time.

    Subscribe it (``lc.trace.subscribe(timer)``) and take finished steps with :meth:`pop_completed`; each
    record costs O(1), so a long run never re-scans its trace. A state is occupied from the ``t_enter`` of the
    record entering it to the ``t_enter`` of the next record (its entry actions count towards it). Step ``k``
    runs from the return to collection after step ``k-1`` (the run's start for the first step) to the return to
    collection (or a final state) after its training, so the collection time before the step (waiting for the
    replay buffer) is part of it. Time in the state the machine is in now is not counted. ``rank`` keeps one
    rank's records of a merged trace (default: the first rank seen).
    """

    def __init__(self, spec: LifecycleSpec = LIFECYCLE, *, rank: int | None = None) -> None:
        self._ends = _step_end_states(spec)
        self._rank = rank
        self._lock = threading.Lock()
        self._prev: TraceRecord | None = None
        self._start_step: int | None = None  # optimizer steps counted when the open step began
        self._current: dict[str, float] = {}
        self._completed: list[dict[str, float]] = []

    def __call__(self, record: TraceRecord) -> None:
        """Add one record (the trace subscriber interface)."""
        with self._lock:
            if self._rank is None:
                self._rank = record.rank
            if record.rank != self._rank:
                return
            prev = self._prev
            if prev is not None:
                self._current[prev.dest] = self._current.get(prev.dest, 0.0) + max(0.0, record.t_enter - prev.t_enter)
            else:
                self._start_step = record.step
            self._prev = record
            if self._start_step is not None and record.step > self._start_step and record.dest in self._ends:
                self._completed.append(self._current)
                self._current = {}
                self._start_step = record.step

    def pop_completed(self) -> list[dict[str, float]]:
        """The steps finished since the last call (oldest first), removed from the timer."""
        with self._lock:
            out, self._completed = self._completed, []
            return out

    def partial(self) -> dict[str, float]:
        """Seconds of the open step so far (states already left)."""
        with self._lock:
            return dict(self._current)


def state_times_per_step(records: Iterable[TraceRecord], rank: int | None = None) -> list[dict[str, float]]:
    """Seconds spent in each state, per training step, from a lifecycle trace (one rank's records).

    The same rule as :class:`StateTimer` (which does this incrementally); an open step with time in it is
    listed last. ``rank`` selects one rank of a merged trace (default: the lowest rank present).
    """
    recs = [r for r in records if rank is None or r.rank == rank]
    recs.sort(key=lambda r: (r.rank, r.seq))
    timer = StateTimer(rank=recs[0].rank if recs else rank)
    for r in recs:
        timer(r)
    steps = timer.pop_completed()
    rest = timer.partial()
    if rest:
        steps.append(rest)
    return steps


def state_time_metrics(times: dict[str, float], prefix: str = "time/") -> dict[str, float]:
    """``{"time/Training_s": 0.12, ...}`` from one entry of :func:`state_times_per_step`."""
    return {f"{prefix}{state}_s": float(seconds) for state, seconds in sorted(times.items())}


def step_metrics(
    buffer: ReplayBuffer | None = None,
    collector: AsyncCollector | None = None,
    trace: Sequence[TraceRecord] | None = None,
    step: int | None = None,
    *,
    times: Sequence[dict[str, float]] | None = None,
) -> dict[str, float]:
    """Buffer stats (size, average age, evicted as stale), collector counters and the time in each state.

    ``times``: steps taken from a :class:`StateTimer` (summed when several finished since the last log); else,
    from a whole ``trace``, the time in each state of ``step`` (default: the last complete step; this re-scans
    the trace, so prefer ``times`` in a loop).
    """
    out: dict[str, float] = {}
    if buffer is not None:
        out.update(buffer.stats().as_metrics())
    if collector is not None:
        out.update(collector.stats().as_metrics())
    if times:
        total: dict[str, float] = {}
        for t in times:
            for state, seconds in t.items():
                total[state] = total.get(state, 0.0) + seconds
        out.update(state_time_metrics(total))
    elif trace:
        per_step = state_times_per_step(trace)
        if per_step:
            idx = len(per_step) - 1 if step is None else step
            if 0 <= idx < len(per_step):
                out.update(state_time_metrics(per_step[idx]))
    return out


__all__ = ["StateTimer", "state_time_metrics", "state_times_per_step", "step_metrics"]
