"""Run one HTTP request's choices on a request-level engine: admission, stop strings, streaming, cancellation.

A request passes the :class:`~colo_fsm.server.gate.SuspendGate` only to be *handed* to the engine (``submit``);
it is never handed to an engine that is not awake. With ``inflight="park"`` (the default) it leaves the gate at
once and a suspend parks it in the engine with the rest; with ``"drain"`` it holds its place until it finished,
so a suspend waits for it. Tokens reach the caller through the engine's ``on_token`` callback, so a stream that
spans a training step pauses and continues; a client that goes away has its request cancelled in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import ClientGone, ServerStopping
from colo_fsm.log import get_logger
from colo_fsm.server.gate import SuspendGate
from colo_fsm.server.params import Sampling

log = get_logger(__name__)

try:  # the engine's request-level API
    from colo_fsm.adapters.batching import Priority

    SERVER_PRIORITY: Any = Priority.SERVER
except ImportError:  # pragma: no cover - before the request-level engine exists
    SERVER_PRIORITY = 1


@runtime_checkable
class TokenEngine(Protocol):
    """The request-level engine the server drives (``MegatronEngine`` implements it)."""

    def submit(self, prompt_ids: Sequence[int], **kwargs: Any) -> Any:
        """Queue one request; returns a handle with ``future``, ``cancel()`` and ``done()``."""


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice: what the engine generated, with the text cut at a stop string."""

    index: int
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]
    text: str
    finish_reason: str
    stop_reason: str | int | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token, when asked: (token_id, logprob)


def _cut(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """``text`` up to the first stop string (and which one), else unchanged."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return (text, None) if best is None else (text[: best[0]], best[1])


class _Choice:
    """One submitted choice: collects tokens from ``on_token`` (engine thread), ends it at a stop string."""

    def __init__(self, index: int, prompt_ids: Sequence[int], sampling: Sampling, detok: Callable[[Any], str]) -> None:
        self.index = index
        self.prompt_ids = tuple(prompt_ids)
        self.sampling = sampling
        self.detok = detok
        self.ids: list[int] = []
        self.cancelled = False
        self.stopped: str | None = None
        self.handle: Any = None
        self.sink: Callable[[tuple[Any, ...]], None] | None = None

    def on_token(self, token_id: int, logprob: float, version: int, top: Any = ()) -> bool | None:
        if self.cancelled:
            return False
        self.ids.append(int(token_id))
        if self.sink is not None:
            self.sink(("token", self.index, int(token_id), float(logprob), int(version), tuple(top or ())))
        if self.sampling.stop:
            _, hit = _cut(self.detok(self.ids), self.sampling.stop)
            if hit is not None:
                self.stopped = hit
                return False
        return None

    def result(self, completion: Any) -> ChoiceResult:
        """The finished choice from the engine's ``TokenCompletion``."""
        if completion.finish_reason == "abort" and not self.cancelled:
            raise ServerStopping("the engine was shut down before this request finished; the server is shutting down")
        token_ids = tuple(int(t) for t in completion.token_ids)
        text, hit = _cut(self.detok(token_ids), self.sampling.stop)
        finish = completion.finish_reason
        stop_reason: str | int | None = None
        if hit is not None:
            finish, stop_reason = "stop", hit
        elif finish == "stop" and token_ids and token_ids[-1] in self.sampling.stop_token_ids:
            stop_reason = token_ids[-1]
        return ChoiceResult(
            self.index,
            tuple(int(t) for t in (completion.prompt_ids or self.prompt_ids)),
            token_ids,
            tuple(float(x) for x in completion.logprobs),
            tuple(int(v) for v in getattr(completion, "weight_versions", ()) or ()),
            text,
            finish,
            stop_reason,
            tuple(tuple(top) for top in getattr(completion, "top_logprobs", ()) or ())[: len(token_ids)],
        )


class RequestRun:
    """The choices of one HTTP request on the engine (``prompts x n``), from admission to the last token."""

    def __init__(
        self,
        engine: Any,
        detok: Callable[[Any], str],
        gate: SuspendGate,
        prompts: Sequence[Sequence[int]],
        sampling: Sampling,
        *,
        timeout_s: float,
        hold_gate: bool,
        priority: Any = SERVER_PRIORITY,
    ) -> None:
        self.engine = engine
        self.gate = gate
        self.sampling = sampling
        self.timeout_s = timeout_s
        self.hold_gate = hold_gate
        self.priority = priority
        self.choices = [
            _Choice(p_i * sampling.n + j, p, sampling, detok)
            for p_i, p in enumerate(prompts)
            for j in range(sampling.n)
        ]
        self._stack = contextlib.AsyncExitStack()

    async def start(self, sink: Callable[[tuple[Any, ...]], None] | None = None) -> None:
        """Wait for the gate (503 after ``timeout_s``), hand every choice to the awake engine."""
        await self._stack.enter_async_context(self.gate.admit_async(self.timeout_s))
        try:
            s = self.sampling
            extra = {"top_logprobs": s.top_logprobs} if s.top_logprobs else {}  # only engines that record them
            by_turn = getattr(self.engine, "admits_by_turn", False) is True  # round-robin across requests
            for c in self.choices:
                c.sink = sink
                turn = {"turn": c.index} if by_turn else {}
                c.handle = self.engine.submit(
                    c.prompt_ids,
                    max_tokens=s.max_tokens,
                    temperature=s.temperature,
                    top_p=s.top_p,
                    top_k=s.top_k,
                    seed=s.seed_for(c.index),
                    stop_token_ids=s.stop_token_ids,
                    priority=self.priority,
                    on_token=c.on_token,
                    **extra,
                    **turn,
                )
        except BaseException:
            self.cancel()
            await self._stack.aclose()
            raise
        if not self.hold_gate:
            await self._stack.aclose()  # park: a suspend may come now; the engine keeps these requests

    def cancel_unfinished(self) -> None:
        """Abort the choices still running (a no-op once all finished)."""
        if any(c.handle is not None and not c.handle.done() for c in self.choices):
            self.cancel()

    def cancel(self) -> None:
        """Abort every unfinished choice in the engine."""
        for c in self.choices:
            c.cancelled = True
            if c.handle is not None and not c.handle.done():
                c.handle.cancel()

    async def release(self) -> None:
        """Leave the gate (drain mode holds it until the request finished)."""
        await self._stack.aclose()

    async def wait(self, gone: asyncio.Event | None = None) -> list[ChoiceResult]:
        """Every choice's result; when ``gone`` is set first (the client went away) every choice is cancelled in the
        engine and :class:`ClientGone` (stage ``generation``) is raised."""
        futs = [_bridge(c.handle.future) for c in self.choices]
        gathered = asyncio.gather(*futs, return_exceptions=True)
        try:
            if gone is not None:
                left: asyncio.Future[Any] = asyncio.ensure_future(gone.wait())
                try:
                    await asyncio.wait([gathered, left], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    left.cancel()
                if not gathered.done():
                    self.cancel()  # the engine answers every choice "abort"; the gathered results go unread
                    raise ClientGone("generation", f"client disconnected; {len(self.choices)} choice(s) cancelled")
            outs = await gathered
        finally:
            self.cancel_unfinished()
            await self.release()
        results = []
        for c, out in zip(self.choices, outs):
            if isinstance(out, asyncio.CancelledError):
                raise ServerStopping("the request was aborted in the engine; the server is shutting down")
            if isinstance(out, BaseException):
                raise out
            results.append(c.result(out))
        return results

    async def events(self) -> AsyncIterator[tuple[Any, ...]]:
        """Start streaming: ``("token", index, id, logprob, version, top)`` and ``("done", index, ChoiceResult)``."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        def sink(ev: tuple[Any, ...]) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed: the client is gone
                loop.call_soon_threadsafe(queue.put_nowait, ev)

        await self.start(sink)
        for c in self.choices:
            c.handle.future.add_done_callback(lambda f, c=c: sink(("end", c.index, f)))
        return self._drain_queue(queue)

    async def _drain_queue(self, queue: asyncio.Queue[tuple[Any, ...]]) -> AsyncIterator[tuple[Any, ...]]:
        left = len(self.choices)
        try:
            while left:
                ev = await queue.get()
                if ev[0] == "end":
                    left -= 1
                    c = self.choices[ev[1]]
                    f = ev[2]
                    if f.cancelled():
                        raise ServerStopping("the request was aborted in the engine; the server is shutting down")
                    exc = f.exception()
                    if exc is not None:
                        raise exc
                    yield ("done", ev[1], c.result(f.result()))
                else:
                    yield ev
        finally:
            if left:
                self.cancel()  # the client went away (or the stream failed): abort in the engine
            await self.release()


def _bridge(fut: Any) -> asyncio.Future[Any]:
    """An asyncio future following a ``concurrent.futures.Future`` one way: cancelling it (the HTTP task was
    cancelled) never cancels the engine's future; the request is aborted through ``handle.cancel()`` instead."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[Any] = loop.create_future()

    def copy(f: Any) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
        elif f.exception() is not None:
            out.set_exception(f.exception())
        else:
            out.set_result(f.result())

    def done(f: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(copy, f)

    fut.add_done_callback(done)
    return out


__all__ = [
    "SERVER_PRIORITY",
    "ChoiceResult",
    "ClientGone",
    "RequestRun",
    "ServerStopping",
    "TokenEngine",
]
