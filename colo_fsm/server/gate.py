"""The suspend gate: requests wait while the engine is suspended and never run during a handoff.

``close_and_drain()`` closes the gate (new requests wait) and returns once every admitted request has
finished; only then may the engine be suspended. ``open()`` lets waiting requests in again. A request that
waits longer than its timeout gets :class:`~colo_fsm.errors.ServerUnavailable` (HTTP 503 with Retry-After).
Every closed period (a handoff: close to reopen) is measured in :attr:`SuspendGate.handoffs`, which the 503's
``Retry-After`` and the handoff-duration metric read.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from colo_fsm.errors import ConfigError, ServerUnavailable, WaitTimeout
from colo_fsm.log import get_logger
from colo_fsm.server.retry import HandoffLengths

log = get_logger(__name__)


@dataclass(frozen=True)
class ServedSpan:
    """One admitted request: when it was admitted and when it released the gate (``time.time()``, like traces).

    ``checked`` is the wall time just before the gate read the ``admit`` predicate that let it in, so whatever that
    predicate read (e.g. the lifecycle's state) held at some instant between ``checked`` and ``admitted``.
    """

    admitted: float
    released: float
    waited_s: float
    checked: float


@dataclass(frozen=True)
class ClosedSpan:
    """One closed period: ``closing`` (gate closed), ``drained`` (no request in flight), ``opened`` (reopened).

    Wall-clock ``time.time()`` seconds, comparable with :class:`~colo_fsm.machine.trace.TraceRecord` times.
    """

    closing: float
    drained: float
    opened: float | None


class SuspendGate:
    """Admission gate shared by the HTTP server, the collector's generator and Ray workers.

    A request is admitted only while the gate is open and ``admit()`` (optional; e.g. "the lifecycle is in
    Generating or Validating") returns True; it is counted in flight until it leaves. With ``record=True``
    the gate keeps :class:`ServedSpan` and :class:`ClosedSpan` lists for tests and benchmarks.
    """

    def __init__(
        self,
        *,
        name: str = "engine",
        is_open: bool = False,
        admit: Callable[[], bool] | None = None,
        state: Callable[[], str] | None = None,
        poll_s: float = 0.01,
        record: bool = False,
    ) -> None:
        if admit is not None and not callable(admit):
            raise ConfigError("admit", admit, "a callable () -> bool, or None")
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or poll_s <= 0:
            raise ConfigError("poll_s", poll_s, "a positive number of seconds")
        self.name = name
        self._open = bool(is_open)
        self._admit = admit
        self._state = state
        self._poll_s = float(poll_s)
        self._record = record
        self._cond = threading.Condition()
        self._in_flight = 0
        self._waiting = 0
        self._admitted = 0
        self._timeouts = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.served: list[ServedSpan] = []
        self.closed_spans: list[ClosedSpan] = []
        self._closing_at: float | None = None
        self._drained_at: float | None = None
        self._retired = False
        self.handoffs = HandoffLengths()  # the length of every closed period (close_and_drain to open)
        self._handoff_listeners: list[Callable[[float], None]] = []

    def on_handoff(self, listener: Callable[[float], None]) -> None:
        """Call ``listener(seconds)`` with the length of every handoff when the gate reopens (e.g. a histogram's
        ``observe``); a listener that raises is logged and never affects the gate."""
        self._handoff_listeners.append(listener)

    # ------------------------------------------------------------------ queries
    @property
    def is_open(self) -> bool:
        """Whether the gate admits requests (the ``admit`` predicate aside)."""
        return self._open

    @property
    def in_flight(self) -> int:
        """Admitted requests that have not left yet."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Requests waiting for the gate to open."""
        return self._waiting

    def counters(self) -> dict[str, int]:
        """Admitted, timed out, in flight and waiting counts."""
        with self._cond:
            return {
                "admitted": self._admitted,
                "timed_out": self._timeouts,
                "in_flight": self._in_flight,
                "waiting": self._waiting,
            }

    def state(self) -> str:
        """``"open"``, ``"closed"`` or the ``state`` callable's answer when the gate is closed (e.g. the lifecycle state)."""
        if self._open:
            return "open"
        if self._retired:
            return "stopped"
        if self._state is not None:
            try:
                return str(self._state())
            except Exception:  # a status callable must never break a request
                log.exception("gate state callable failed")
        return "closed"

    def closed_periods(self) -> list[ClosedSpan]:
        """Recorded closed periods, the current one included (``opened=None`` while still closed)."""
        with self._cond:
            spans = list(self.closed_spans)
            if not self._open and self._closing_at is not None:
                spans.append(ClosedSpan(self._closing_at, self._drained_at or self._closing_at, None))
            return spans

    # ------------------------------------------------------------------ control
    def open(self) -> None:
        """Let requests in (after the engine resumed); a retired gate stays closed."""
        waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]
        with self._cond:
            if self._open or self._retired:
                return
            self._open = True
            if self._record and self._closing_at is not None:
                self.closed_spans.append(
                    ClosedSpan(self._closing_at, self._drained_at or self._closing_at, time.time())
                )
            self._closing_at = self._drained_at = None
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_resolve, fut)
        length = self.handoffs.ended()
        if length is not None:
            for listener in list(self._handoff_listeners):
                try:
                    listener(length)
                except Exception:
                    log.exception("%s gate: a handoff listener failed", self.name)
        log.debug("%s gate open", self.name)

    def close_and_drain(self, timeout: float | None = None) -> float:
        """Close the gate, then wait until no admitted request is in flight; returns the seconds waited.

        Raises :class:`~colo_fsm.errors.WaitTimeout` (the gate stays closed) if requests are still running
        after ``timeout`` seconds: the engine must not be suspended under them.
        """
        t0 = time.monotonic()
        with self._cond:
            if self._open or self._closing_at is None:
                self._closing_at = time.time()
                self._drained_at = None
                self.handoffs.began()
            self._open = False
            if not self._cond.wait_for(lambda: self._in_flight == 0, timeout=timeout):
                raise WaitTimeout(
                    f"{self.name}: in-flight requests to finish before suspend",
                    0.0 if timeout is None else float(timeout),
                    f"{self._in_flight} still running",
                )
            if self._drained_at is None:
                self._drained_at = time.time()
        waited = time.monotonic() - t0
        log.debug("%s gate closed and drained in %.1f ms", self.name, waited * 1e3)
        return waited

    def retire(self) -> None:
        """Close for good (engine torn down): waiting and future requests fail at once with ServerUnavailable."""
        with self._cond:
            self._open = False
            self._retired = True
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, fut)

    @property
    def retired(self) -> bool:
        """True once :meth:`retire` was called."""
        return self._retired

    # ------------------------------------------------------------------ admission
    def admissible(self) -> bool:
        """Whether a request arriving now would be admitted (gate open and the ``admit`` predicate true)."""
        return self._admissible()

    def _admissible(self) -> bool:
        if not self._open:
            return False
        if self._admit is None:
            return True
        try:
            return bool(self._admit())
        except Exception:
            log.exception("gate admit predicate failed; not admitting")
            return False

    def _unavailable(self, waited: float) -> ServerUnavailable:
        with self._cond:
            self._timeouts += 1
        return ServerUnavailable(waited, self.state())

    def _try_enter_locked(self, t0: float) -> tuple[float, float, float] | None:
        """Under the lock: take a place in flight if admissible; (checked, admitted wall times, seconds waited) or None."""
        checked = time.time()
        if not self._admissible():
            return None
        self._in_flight += 1
        self._admitted += 1
        return checked, time.time(), time.monotonic() - t0

    def _leave(self, checked: float, admitted_at: float, waited: float) -> None:
        with self._cond:
            self._in_flight -= 1
            if self._record:
                self.served.append(ServedSpan(admitted_at, time.time(), waited, checked))
            self._cond.notify_all()

    @contextlib.contextmanager
    def admit(self, timeout: float | None = None) -> Iterator[float]:
        """Wait (up to ``timeout`` s) until admitted, hold a place in flight for the ``with`` body; yields seconds waited.

        Raises :class:`~colo_fsm.errors.ServerUnavailable` when the wait times out.
        """
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        entered: tuple[float, float, float] | None = None
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    entered = self._try_enter_locked(t0)
                    if entered is not None:
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if self._retired or (remaining is not None and remaining <= 0):
                        break
                    # closed: sleep until open() notifies; open but refused by the predicate: poll it
                    wait = self._poll_s if (self._open and self._admit is not None) else remaining
                    if remaining is not None and wait is not None:
                        wait = min(wait, remaining)
                    self._cond.wait(wait)
            finally:
                self._waiting -= 1
        if entered is None:
            raise self._unavailable(time.monotonic() - t0)
        try:
            yield entered[2]
        finally:
            self._leave(*entered)

    @contextlib.asynccontextmanager
    async def admit_async(self, timeout: float | None = None) -> AsyncIterator[float]:
        """The asyncio form of :meth:`admit`: waits without blocking the event loop."""
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        entered: tuple[float, float, float] | None = None
        with self._cond:
            self._waiting += 1
        try:
            while True:
                with self._cond:
                    entered = self._try_enter_locked(t0)
                    if entered is not None:
                        break
                    fut: asyncio.Future[None] | None = None
                    if self._retired:
                        break
                    if not self._open:
                        fut = loop.create_future()
                        self._waiters.append((loop, fut))
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                if fut is None:  # open, but the admit predicate says no: poll it
                    await asyncio.sleep(self._poll_s if remaining is None else min(self._poll_s, remaining))
                else:
                    try:
                        await asyncio.wait_for(fut, remaining)
                    except TimeoutError:
                        pass
                    finally:
                        with self._cond:
                            if (loop, fut) in self._waiters:
                                self._waiters.remove((loop, fut))
        finally:
            with self._cond:
                self._waiting -= 1
        if entered is None:
            raise self._unavailable(time.monotonic() - t0)
        try:
            yield entered[2]
        finally:
            self._leave(*entered)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def overlaps(served: list[ServedSpan], closed: list[ClosedSpan]) -> list[tuple[ServedSpan, ClosedSpan]]:
    """Served requests that ran while the gate was closed and drained (must be empty)."""
    bad = []
    for s in served:
        for c in closed:
            end = c.opened if c.opened is not None else float("inf")
            if s.admitted < end and s.released > c.drained:
                bad.append((s, c))
    return bad


__all__ = ["ClosedSpan", "ServedSpan", "SuspendGate", "overlaps"]
