"""Admission counted in tokens: what one request costs the engine, the per-request bound, and the server-wide
bound on HTTP work held by the engine (:class:`TokenBudget`).

A request costs the engine every token it makes it process: ``sum over prompts of (prompt tokens + max_tokens)
x n`` (each of the ``n`` choices prefills its prompt and decodes up to ``max_tokens``). A request over
``max_request_tokens`` gets a 400 naming the limit and the value. Admitted requests hold their cost in the
:class:`TokenBudget` until they are answered or aborted; a request that does not fit waits (first come, first
served) and gets a 429 with ``Retry-After`` when its wait ends, or at once when ``max_waiting_requests`` wait
already. Nothing is dropped silently: every request is answered or refused with a status that says why.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence

from colo_fsm.errors import ConfigError, ServerBusy
from colo_fsm.server.params import BadRequest, Sampling


def request_cost(prompt_lengths: Sequence[int], sampling: Sampling) -> int:
    """Tokens the engine processes for this request: ``sum((prompt + max_tokens) x n)`` over its prompts."""
    return sum((int(n_tok) + sampling.max_tokens) * sampling.n for n_tok in prompt_lengths)


def check_request_size(prompt_lengths: Sequence[int], sampling: Sampling, bound: int, prompt_param: str) -> int:
    """The request's cost; 400 when it is over ``bound``, naming the field at fault (``max_tokens`` when a smaller
    ``max_tokens`` could fit it, else the prompt field ``prompt_param``), the value and the limit."""
    cost = request_cost(prompt_lengths, sampling)
    if cost <= bound:
        return cost
    prompt_tokens = sum(prompt_lengths)
    param = "max_tokens" if (prompt_tokens + len(prompt_lengths)) * sampling.n <= bound else prompt_param
    raise BadRequest(
        param,
        f"this request costs the engine {cost} tokens (prompt tokens {prompt_tokens} x n {sampling.n} + "
        f"{len(prompt_lengths)} prompt(s) x n {sampling.n} x max_tokens {sampling.max_tokens}), over the "
        f"per-request limit max_request_tokens={bound}",
    )


class TokenBudget:
    """Tokens of HTTP work the engine holds (admitted, not yet answered or aborted), at most ``limit``.

    :meth:`acquire` takes a request's cost, waiting first come, first served while it does not fit;
    :meth:`release` gives it back. Used from one event loop (the server's), so it needs no lock; ``/health``
    reads its counters without waiting on anything.
    """

    def __init__(self, limit: int, max_waiting: int) -> None:
        for name, v in (("max_inflight_tokens", limit), ("max_waiting_requests", max_waiting)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, v, "a positive integer")
        self.limit = limit
        self.max_waiting = max_waiting
        self.held = 0
        self.holders = 0
        self.refused = 0
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for room."""
        return len(self._queue)

    @property
    def waiting_tokens(self) -> int:
        """Tokens the waiting requests would hold."""
        return sum(c for c, _ in self._queue)

    def counters(self) -> dict[str, int]:
        """Held tokens and requests, waiting ones, the limit and the number refused (for ``/health``)."""
        return {
            "held_tokens": self.held,
            "held_requests": self.holders,
            "waiting_requests": self.waiting,
            "waiting_tokens": self.waiting_tokens,
            "max_inflight_tokens": self.limit,
            "refused_busy": self.refused,
        }

    def _fits(self, cost: int) -> bool:
        return self.held + cost <= self.limit

    def _take(self, cost: int) -> None:
        self.held += cost
        self.holders += 1

    async def acquire(self, cost: int, timeout: float) -> float:
        """Take ``cost`` tokens, waiting up to ``timeout`` s; seconds waited. :class:`ServerBusy` when too many
        requests wait already or the wait ends first (the caller may map it to 503 while suspended)."""
        if cost > self.limit:
            raise ConfigError("cost", cost, f"at most max_inflight_tokens={self.limit}")
        if not self._queue and self._fits(cost):
            self._take(cost)
            return 0.0
        if len(self._queue) >= self.max_waiting:
            self.refused += 1
            raise ServerBusy(
                "max_waiting_requests",
                f"{len(self._queue)} requests already wait for room in the engine (limit {self.max_waiting})",
            )
        t0 = time.monotonic()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (cost, fut)
        self._queue.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if not fut.done():
                self._queue.remove(entry)
                self._wake()  # the next one may fit now
                self.refused += 1
                waited = time.monotonic() - t0
                raise ServerBusy(
                    "max_inflight_tokens",
                    f"this request costs {cost} tokens and {self.held} of the server's {self.limit} are held by "
                    f"other requests; waited {waited:.1f} s",
                    waited,
                ) from None
        except BaseException:
            if fut.done():
                self.release(cost)  # it was granted as the wait was cancelled: give it back
            else:
                self._queue.remove(entry)
                self._wake()
            raise
        return time.monotonic() - t0

    def release(self, cost: int) -> None:
        """Give back ``cost`` tokens taken by :meth:`acquire`; wake the waiting requests that fit now."""
        self.held -= cost
        self.holders -= 1
        self._wake()

    def _wake(self) -> None:
        while self._queue and self._fits(self._queue[0][0]):
            cost, fut = self._queue.popleft()
            if fut.done():
                continue
            self._take(cost)
            fut.set_result(None)


__all__ = ["TokenBudget", "check_request_size", "request_cost"]
