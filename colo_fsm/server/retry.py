"""``Retry-After`` from what the server measured, never a constant.

* A 429 (the token budget is full, or too many requests wait for it): the tokens that must be given back before
  this request could start, divided by the budget's observed drain rate (:class:`DrainRate`: tokens released per
  second over the last ``window_s``).
* A 503 (the engine stayed suspended past ``request_timeout_s``): how much longer handoffs that lasted at least as
  long as this one went on, from the recent handoffs' measured lengths (:class:`HandoffLengths`).

Both are clamped to ``[floor, cap]`` whole seconds (``retry_after_s`` and ``ServerSettings.max_retry_after_s``);
with nothing measured yet the answer is the floor, and with a budget that released nothing in the whole window
it is the cap.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from colo_fsm.errors import ConfigError

DRAIN_WINDOW_S = 30.0
"""The window over which the budget's drain rate is measured."""
HANDOFFS_KEPT = 32
"""How many recent handoff lengths the 503 estimate looks at."""


def clamp_seconds(seconds: float, floor: int, cap: int) -> int:
    """``seconds`` rounded up to whole seconds, within ``[floor, cap]``."""
    if not math.isfinite(seconds):
        return cap
    return max(floor, min(cap, math.ceil(seconds)))


class DrainRate:
    """Tokens given back to a budget per second, over the last ``window_s`` seconds (event-loop thread only)."""

    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(window_s, bool) or not isinstance(window_s, int | float) or window_s <= 0:
            raise ConfigError("window_s", window_s, "a positive number of seconds")
        self.window_s = float(window_s)
        self._clock = clock
        self._start = clock()
        self._events: deque[tuple[float, int]] = deque()
        self._sum = 0

    def add(self, tokens: int) -> None:
        """Record ``tokens`` given back now."""
        self._events.append((self._clock(), int(tokens)))
        self._sum += int(tokens)
        self._trim()

    def _trim(self) -> None:
        horizon = self._clock() - self.window_s
        while self._events and self._events[0][0] < horizon:
            self._sum -= self._events.popleft()[1]

    def per_second(self) -> float:
        """Tokens released per second over the window (over the time since the budget began while that is
        shorter; at least one second)."""
        self._trim()
        span = max(1.0, min(self.window_s, self._clock() - self._start))
        return self._sum / span

    def seconds_until(self, tokens: int, floor: int, cap: int) -> int:
        """Whole seconds until ``tokens`` more are given back at the observed rate: ``floor`` when none need to
        be, ``cap`` when nothing drained within the window."""
        if tokens <= 0:
            return floor
        rate = self.per_second()
        return cap if rate <= 0 else clamp_seconds(tokens / rate, floor, cap)


class HandoffLengths:
    """The lengths of the recent handoffs (a suspend gate closed until it opened again), and the one running now.

    Thread-safe: the lifecycle's thread records, the server's event loop reads.
    """

    def __init__(self, keep: int = HANDOFFS_KEPT, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._recent: deque[float] = deque(maxlen=keep)
        self._began: float | None = None
        self.count = 0
        self.total_s = 0.0

    def began(self) -> None:
        """A handoff starts now (the gate closed); a second call before :meth:`ended` keeps the first start."""
        with self._lock:
            if self._began is None:
                self._began = self._clock()

    def ended(self) -> float | None:
        """The handoff running since :meth:`began` ended now: its length is recorded and returned (None if none
        was running)."""
        with self._lock:
            if self._began is None:
                return None
            length = max(0.0, self._clock() - self._began)
            self._began = None
        self.record(length)
        return length

    def record(self, seconds: float) -> None:
        """Record one handoff's length in seconds."""
        with self._lock:
            self._recent.append(float(seconds))
            self.count += 1
            self.total_s += float(seconds)

    def elapsed(self) -> float | None:
        """Seconds the handoff running now has lasted (None while none runs)."""
        began = self._began
        return None if began is None else max(0.0, self._clock() - began)

    def recent(self) -> list[float]:
        """The recent lengths, oldest first."""
        with self._lock:
            return list(self._recent)

    def remaining(self, elapsed: float) -> float | None:
        """How much longer a handoff that has lasted ``elapsed`` seconds is expected to go on: the median excess of
        the recent handoffs that lasted longer; as long again when none did; None when none was measured."""
        recent = self.recent()
        if not recent:
            return None
        longer = [d - elapsed for d in recent if d > elapsed]
        return statistics.median(longer) if longer else max(elapsed, statistics.median(recent))

    def retry_after(self, floor: int, cap: int) -> int:
        """``Retry-After`` for a request that waited for the handoff running now (``floor`` when nothing was
        measured yet)."""
        remaining = self.remaining(self.elapsed() or 0.0)
        return floor if remaining is None else clamp_seconds(remaining, floor, cap)


__all__ = ["DRAIN_WINDOW_S", "HANDOFFS_KEPT", "DrainRate", "HandoffLengths", "clamp_seconds"]
