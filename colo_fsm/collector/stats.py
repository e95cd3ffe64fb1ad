"""What a collector reports: its counters, one snapshot at a time (:meth:`~colo_fsm.collector.collector.AsyncCollector.stats`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CollectorStats:
    """Counters of one collector.

    ``started == completed + failed + deferred + abandoned + in_flight``: every start ends in exactly one of
    those. ``deferred`` counts rollouts that raised :class:`~colo_fsm.errors.RolloutDeferred` (their prompts were
    put back, not lost); ``abandoned`` those a stop took back (:meth:`~colo_fsm.collector.collector.AsyncCollector.take_back`: their results
    are discarded, their prompts put back); ``returned`` is how many put-back prompts wait to be started again. ``parked``
    (part of ``in_flight``) counts rollouts in flight across at least one pause and not finished yet;
    ``spanning`` counts finished rollouts that were in flight across a pause (``version_changed_mid_rollout``:
    those whose weight version changed meanwhile). ``pauses`` counts pauses (one per handoff);
    ``in_flight_at_pause`` is how many rollouts were in flight when the last one began: what park kept in the
    engine, or what a drain waited for (at most: rollouts that defer end at once); 0 before the first pause. A
    pause while already paused is not counted, and a stop's :meth:`~colo_fsm.collector.collector.AsyncCollector.take_back` is not a pause.
    """

    started: int
    completed: int
    failed: int
    in_flight: int
    max_in_flight: int
    cap: int
    paused: bool
    exhausted: bool
    version_changed_mid_rollout: int
    deferred: int = 0
    returned: int = 0
    parked: int = 0
    spanning: int = 0
    abandoned: int = 0
    pauses: int = 0
    in_flight_at_pause: int = 0

    def as_metrics(self, prefix: str = "collector/") -> dict[str, float]:
        """Flat ``{name: number}`` for :class:`colo_fsm.metrics.MetricsLogger`."""
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


__all__ = ["CollectorStats"]
