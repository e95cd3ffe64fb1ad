"""The server-wide bound on HTTP work the engine holds, in tokens, with fair admission (:class:`TokenBudget`).

Admitted requests hold their cost (:func:`~colo_fsm.server.admission.request_cost`) until the engine is done
with them. A request that does not fit waits, and the waiting ones are granted **earliest deadline first**, where
a request's deadline is

    arrival + fair_window_s x cost / limit

so cost-aware queueing and aging are one rule: a 3-token request passes an ``n=64`` request that arrived up to
``fair_window_s x 64-request cost / limit`` seconds before it, and every later arrival has a later deadline than
a request that has waited that long, so nothing starves. A waiting request that does not fit yet never blocks
cheaper ones behind it that do (they go first) until its deadline has passed: from then on it reserves the room
it waits for, and nothing behind it is granted until it fits. One request costs at most
``max_request_share`` of the budget (checked before it gets here), so room for it comes back.

A request that waits longer than its timeout, or that finds ``max_waiting`` requests waiting already, gets
:class:`~colo_fsm.errors.ServerBusy` (HTTP 429) carrying a ``Retry-After`` computed from the budget's observed
drain rate (:mod:`colo_fsm.server.retry`). A waiter cancelled (its client went away) leaves the queue; one
cancelled just as it was granted gives its tokens back at once.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from colo_fsm.errors import ConfigError, ServerBusy
from colo_fsm.server.retry import DRAIN_WINDOW_S, DrainRate
from colo_fsm.server.settings import DEFAULT_FAIR_WINDOW_S, DEFAULT_MAX_RETRY_AFTER_S


@dataclass(eq=False)
class _Waiter:
    """One request waiting for room: its cost, arrival and deadline (monotonic seconds)."""

    cost: int
    arrived: float
    deadline: float
    seq: int
    fut: asyncio.Future[None] = field(repr=False)

    @property
    def key(self) -> tuple[float, int]:
        return (self.deadline, self.seq)


class TokenBudget:
    """Tokens of HTTP work the engine holds (admitted, not yet answered or aborted), at most ``limit``.

    :meth:`acquire` takes a request's cost, waiting in earliest-deadline order while it does not fit (see the
    module); :meth:`release` gives it back. Used from one event loop (the server's), so it needs no lock;
    ``/health`` and ``/metrics`` read its counters without waiting on anything. ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        limit: int,
        max_waiting: int,
        *,
        fair_window_s: float = DEFAULT_FAIR_WINDOW_S,
        retry_after_s: int = 1,
        max_retry_after_s: int = DEFAULT_MAX_RETRY_AFTER_S,
        drain_window_s: float = DRAIN_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, v in (
            ("max_inflight_tokens", limit),
            ("max_waiting_requests", max_waiting),
            ("retry_after_s", retry_after_s),
            ("max_retry_after_s", max_retry_after_s),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, v, "a positive integer")
        if isinstance(fair_window_s, bool) or not isinstance(fair_window_s, int | float) or fair_window_s <= 0:
            raise ConfigError("fair_window_s", fair_window_s, "a positive number of seconds")
        self.limit = limit
        self.max_waiting = max_waiting
        self.fair_window_s = float(fair_window_s)
        self.retry_floor_s = retry_after_s
        self.retry_cap_s = max(retry_after_s, max_retry_after_s)
        self.held = 0
        self.holders = 0
        self.refused = 0
        self.admitted_tokens = 0  # tokens granted so far (a counter)
        self.admitted_requests = 0
        self.drain = DrainRate(drain_window_s, clock)
        self._clock = clock
        self._seq = itertools.count()
        self._waiters: list[_Waiter] = []  # kept sorted by (deadline, arrival order)

    # ------------------------------------------------------------------ counters
    @property
    def waiting(self) -> int:
        """Requests waiting for room."""
        return len(self._waiters)

    @property
    def waiting_tokens(self) -> int:
        """Tokens the waiting requests would hold."""
        return sum(w.cost for w in self._waiters)

    def counters(self) -> dict[str, int | float]:
        """Held tokens and requests, waiting ones, the limit, refusals and the drain rate (for ``/health``)."""
        return {
            "held_tokens": self.held,
            "held_requests": self.holders,
            "waiting_requests": self.waiting,
            "waiting_tokens": self.waiting_tokens,
            "max_inflight_tokens": self.limit,
            "refused_busy": self.refused,
            "admitted_tokens": self.admitted_tokens,
            "drain_tokens_per_s": round(self.drain.per_second(), 3),
        }

    def deadline(self, cost: int, arrived: float) -> float:
        """When a request of ``cost`` tokens arriving at ``arrived`` is due: ``fair_window_s x cost / limit`` later."""
        return arrived + self.fair_window_s * cost / self.limit

    def retry_after(self, cost: int, ahead_tokens: int) -> int:
        """Whole seconds until a request of ``cost`` behind ``ahead_tokens`` of waiting work would fit, at the
        observed drain rate (clamped to ``[retry_after_s, max_retry_after_s]``)."""
        need = self.held + ahead_tokens + cost - self.limit
        return self.drain.seconds_until(need, self.retry_floor_s, self.retry_cap_s)

    # ------------------------------------------------------------------ granting
    def _fits(self, cost: int) -> bool:
        return self.held + cost <= self.limit

    def _take(self, cost: int) -> None:
        self.held += cost
        self.holders += 1
        self.admitted_tokens += cost
        self.admitted_requests += 1

    def _due_waiter(self, now: float) -> bool:
        """Whether a waiting request's deadline has passed (it reserves the room it waits for)."""
        return bool(self._waiters) and self._waiters[0].deadline <= now

    def _wake(self) -> None:
        """Grant waiting requests in deadline order while they fit; stop at a due one that does not fit."""
        now = self._clock()
        i = 0
        while i < len(self._waiters):
            w = self._waiters[i]
            if w.fut.done():  # pragma: no cover - a waiter leaves the list before its future is resolved
                self._waiters.pop(i)
                continue
            if self._fits(w.cost):
                self._waiters.pop(i)
                self._take(w.cost)
                w.fut.set_result(None)
                continue
            if w.deadline <= now:
                break  # due: nothing behind it is granted until it fits
            i += 1

    def _remove(self, w: _Waiter) -> None:
        if w in self._waiters:
            self._waiters.remove(w)
            self._wake()  # it may have been the due waiter holding the others back

    async def acquire(self, cost: int, timeout: float) -> float:
        """Take ``cost`` tokens, waiting up to ``timeout`` s; the seconds waited. :class:`ServerBusy` (with
        ``retry_after_s``) when ``max_waiting`` requests wait already or the wait ends first. Cancelling the
        waiting task leaves the queue; if it was granted just before, the tokens are given back."""
        if cost > self.limit:
            raise ConfigError("cost", cost, f"at most max_inflight_tokens={self.limit}")
        now = self._clock()
        if self._fits(cost) and not self._due_waiter(now):
            self._take(cost)  # waiters that do not fit yet and are not due never hold back one that fits
            return 0.0
        if len(self._waiters) >= self.max_waiting:
            self.refused += 1
            raise ServerBusy(
                "max_waiting_requests",
                f"{len(self._waiters)} requests already wait for room in the engine (limit {self.max_waiting})",
                0.0,
                self.retry_after(cost, self.waiting_tokens),
            )
        w = _Waiter(cost, now, self.deadline(cost, now), next(self._seq), asyncio.get_running_loop().create_future())
        bisect.insort(self._waiters, w, key=lambda x: x.key)
        try:
            await asyncio.wait_for(asyncio.shield(w.fut), timeout)
        except TimeoutError:
            if not w.fut.done():
                ahead = sum(x.cost for x in self._waiters if x.key < w.key)
                self._remove(w)
                self.refused += 1
                waited = self._clock() - w.arrived
                raise ServerBusy(
                    "max_inflight_tokens",
                    f"this request costs {cost} tokens and {self.held} of the server's {self.limit} are held by "
                    f"other requests ({ahead} more wait ahead of it); waited {waited:.1f} s",
                    waited,
                    self.retry_after(cost, ahead),
                ) from None
        except BaseException:
            if w.fut.done():
                self.release(cost)  # granted just as the wait was cancelled: give it back now
            else:
                self._remove(w)
            raise
        return self._clock() - w.arrived

    def release(self, cost: int) -> None:
        """Give back ``cost`` tokens taken by :meth:`acquire`; grant the waiting requests that fit now."""
        self.held -= cost
        self.holders -= 1
        self.drain.add(cost)
        self._wake()


__all__ = ["TokenBudget"]
