"""Where each request is in its exchange, and noticing a client that went away at any point of it.

A request passes four stages (:class:`Stage`): ``upload`` (its body is read), ``queue`` (it waits for the token
budget, then for an awake engine), ``generation`` (a non-streamed request runs in the engine) and ``stream`` (a
streamed answer is sent). :class:`StageCounts` counts the requests in each stage now (``/health``,
``/metrics``; a test waits on it to act at an exact point).

A client that disconnects, resets the connection or gives up on its own timeout is a *client* outcome at the
stage where it happened, never a server error. During ``upload`` the body reader sees it; during ``queue`` and
``generation`` a :class:`ClientWatch` listens for the ASGI ``http.disconnect`` message and :meth:`ClientWatch.race`
ends the wait with :class:`~colo_fsm.errors.ClientGone` naming the stage (the wait's own clean-up runs first: a
budget grant made at that moment is given back, a request handed to the engine is cancelled); during ``stream``
the streaming response notices it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from enum import StrEnum
from typing import Any, TypeVar

from colo_fsm.errors import ClientGone

T = TypeVar("T")


class Stage(StrEnum):
    """The stages of one HTTP exchange."""

    UPLOAD = "upload"  # the request body is being read
    QUEUE = "queue"  # waiting for the token budget or for a suspended engine
    GENERATION = "generation"  # a non-streamed request in the engine
    STREAM = "stream"  # a streamed answer being sent


class StageCounts:
    """Requests in each :class:`Stage` right now (the server's event loop updates it; readers take a copy)."""

    def __init__(self) -> None:
        self._now = dict.fromkeys(Stage, 0)

    @contextlib.contextmanager
    def inside(self, stage: Stage) -> Iterator[None]:
        """Count one request in ``stage`` for the ``with`` body."""
        self._now[stage] += 1
        try:
            yield
        finally:
            self._now[stage] -= 1

    def now(self) -> dict[str, int]:
        """``{stage: requests in it}``."""
        return {s.value: n for s, n in self._now.items()}


class ClientWatch:
    """Listens on one request's connection once its body was read: :attr:`gone` is set when the client leaves.

    Start it with :meth:`start` and stop it with :meth:`stop` before the response is sent (the ASGI server also
    reports the end of a response as a disconnect).
    """

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self.gone = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> ClientWatch:
        """Begin listening (idempotent); returns self."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())
        return self

    async def _listen(self) -> None:
        while True:
            message = await self._receive()
            if message.get("type") == "http.disconnect":
                self.gone.set()
                return

    async def stop(self) -> None:
        """Stop listening."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def race(self, work: Awaitable[T], stage: Stage) -> T:
        """``await work`` unless the client leaves first: then ``work`` is cancelled, its clean-up runs, and
        :class:`ClientGone` naming ``stage`` is raised. Work that finished anyway (the cancel came too late)
        keeps its result; the next stage notices the client is gone."""
        # eager: work that needs no wait (the budget has room, the gate is open) finishes here, with no task switch
        coro = work if asyncio.iscoroutine(work) else _as_coroutine(work)
        task: asyncio.Task[T] = asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)
        if task.done():
            return task.result()
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the request's own task is cancelled: so is its work, cleanly
            task.cancel()
            await asyncio.wait({task})
            raise
        finally:
            gone.cancel()
        if task.done():
            return task.result()
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise ClientGone(stage.value) from None


async def _as_coroutine[R](work: Awaitable[R]) -> R:
    return await work


__all__ = ["ClientWatch", "Stage", "StageCounts"]
