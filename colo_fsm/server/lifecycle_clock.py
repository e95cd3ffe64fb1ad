"""The lifecycle as the server's metrics show it: the state now, seconds spent in each state, training steps, their
rate and the weight version, kept from the lifecycle's trace one record at a time (:class:`LifecycleClock`).

Subscribe it to a lifecycle's trace (``GatedEngine.attach_lifecycle(lc)`` does); each record costs O(1) and the
clock never calls into the lifecycle. A state is occupied from the ``t_enter`` of the record entering it to the
``t_enter`` of the next; the state the machine is in now counts up to the moment it is read.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

STEP_RATE_WINDOW_S = 60.0
"""The window over which the training step rate is measured."""


@dataclass(frozen=True)
class LifecycleReading:
    """One reading of a :class:`LifecycleClock`."""

    state: str | None
    states: tuple[str, ...]
    seconds_in: dict[str, float] = field(default_factory=dict)
    step: int = 0
    weight_version: int | None = None
    step_rate: float = 0.0
    records: int = 0


class LifecycleClock:
    """A trace subscriber (``lc.trace.subscribe(clock)``) keeping what ``/metrics`` shows of the lifecycle.

    ``states`` are the spec's state names (each gets a series even before it is entered). Thread-safe: the
    lifecycle's thread records, the server reads. ``clock`` is the trace's clock (``time.time``).
    """

    def __init__(
        self,
        states: Iterable[str] = (),
        *,
        rate_window_s: float = STEP_RATE_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._states: list[str] = list(dict.fromkeys(states))
        self._clock = clock
        self._window = float(rate_window_s)
        self._seconds: dict[str, float] = dict.fromkeys(self._states, 0.0)
        self._state: str | None = None
        self._since = 0.0
        self._first_t: float | None = None
        self._step = 0
        self._version: int | None = None
        self._steps_at: deque[float] = deque()  # when each training step in the window completed
        self._records = 0

    def add_states(self, states: Iterable[str]) -> None:
        """Give every one of ``states`` a series (the spec's states, known once the lifecycle is)."""
        with self._lock:
            for s in states:
                if s not in self._seconds:
                    self._states.append(s)
                    self._seconds[s] = 0.0

    def __call__(self, record: Any) -> None:
        """Add one trace record (``source``, ``dest``, ``step``, ``weight_version``, ``t_enter``, ``t_end``)."""
        with self._lock:
            self._records += 1
            if self._state is not None:
                self._seconds[self._state] = self._seconds.get(self._state, 0.0) + max(
                    0.0, record.t_enter - self._since
                )
            else:
                self._first_t = record.t_enter
                self._step = int(record.step)  # a resumed run starts at its checkpoint's step
            if record.dest not in self._seconds:
                self._states.append(record.dest)
                self._seconds[record.dest] = 0.0
            self._state = record.dest
            self._since = record.t_enter
            self._version = int(record.weight_version)
            for _ in range(max(0, int(record.step) - self._step)):
                self._steps_at.append(float(record.t_end))
            self._step = max(self._step, int(record.step))
            while self._steps_at and self._steps_at[0] < record.t_end - self._window:  # bounded without readers
                self._steps_at.popleft()

    def read(self) -> LifecycleReading:
        """The state now, seconds in each state (the current one up to now), steps, rate and weight version."""
        now = self._clock()
        with self._lock:
            seconds = dict(self._seconds)
            if self._state is not None:
                seconds[self._state] = seconds.get(self._state, 0.0) + max(0.0, now - self._since)
            while self._steps_at and self._steps_at[0] < now - self._window:
                self._steps_at.popleft()
            span = min(self._window, now - self._first_t) if self._first_t is not None else 0.0
            rate = len(self._steps_at) / span if span > 0 else 0.0
            return LifecycleReading(
                self._state, tuple(self._states), seconds, self._step, self._version, rate, self._records
            )


__all__ = ["STEP_RATE_WINDOW_S", "LifecycleClock", "LifecycleReading"]
