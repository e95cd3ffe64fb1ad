"""Server-sent-event streams of completions and chat completions: one chunk per token (text held back while it
may still become a stop string), a last chunk per choice with its finish reason, usage on request, ``[DONE]``.

A stream gives its tokens of the budget back as soon as the engine is done with every choice (a slow reader holds
its connection, not the engine's budget); a client that goes away mid-stream is a client outcome at stage
``stream`` and its unfinished choices are cancelled in the engine."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from colo_fsm.log import get_logger
from colo_fsm.server.client import ClientWatch, Stage, StageCounts
from colo_fsm.server.context import ServerContext, Ticket
from colo_fsm.server.formatting import TokenText, sse, usage
from colo_fsm.server.ledger import LedgerEntry
from colo_fsm.server.outcomes import Outcome, RequestTag, tag_of
from colo_fsm.server.params import Sampling, short
from colo_fsm.server.runner import ChoiceResult, RequestRun, ServerStopping, _cut

log = get_logger(__name__)


async def start_stream(
    ctx: ServerContext,
    request: Request,
    prompts: Sequence[Sequence[int]],
    s: Sampling,
    kind: str,
    model: str,
    cost: int,
) -> StreamingResponse:
    """Take ``cost`` tokens of the budget, admit and hand the request to the engine, then answer 200 with its
    event stream (which gives the tokens back once the engine is done, however the stream ends). A client that
    leaves before the 200 is a :class:`~colo_fsm.errors.ClientGone` at stage ``queue``."""
    if ctx.stopping():
        raise ServerStopping("shutting down")
    watch = ClientWatch(request.receive).start()
    try:
        ticket = await ctx.hold_tokens(cost, watch)
        run = ctx.new_run(prompts, s, ticket.time_left_s)
        ctx.active += 1
        try:
            events = await ctx.hand_over(run, watch, ticket, events=True)  # handed to the engine before the 200
        except BaseException:
            ctx.active -= 1
            ticket.release()
            raise
    finally:
        await watch.stop()
    release_when_engine_done(run, ticket)
    end = StreamEnd(ctx, run, events, ticket, ctx.ledger.open(), tag_of(request))
    return _Stream(stream(ctx, run, events, s, kind, model, prompts, end), end, ctx.stages)


def release_when_engine_done(run: RequestRun, ticket: Ticket) -> None:
    """Give ``ticket``'s tokens back (on this event loop) once every choice of ``run`` is done in the engine."""
    loop = asyncio.get_running_loop()
    left = [len(run.choices)]

    def on_loop() -> None:
        left[0] -= 1
        if left[0] == 0:
            ticket.release()

    def one_done(_f: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            loop.call_soon_threadsafe(on_loop)

    for c in run.choices:
        c.handle.future.add_done_callback(one_done)


class StreamEnd:
    """What a stream gives back when it ends, however it ends (even if its body never started): its ledger
    ending, its place in ``ctx.active``, its engine requests (cancelled if unfinished) and its tokens."""

    def __init__(
        self,
        ctx: ServerContext,
        run: RequestRun,
        events: AsyncIterator[tuple[Any, ...]],
        ticket: Ticket,
        entry: LedgerEntry,
        tag: RequestTag | None = None,
    ) -> None:
        self.ctx = ctx
        self.run = run
        self.events = events
        self.ticket = ticket
        self.entry = entry
        self.tag = tag
        self._done = False

    def ended(self, outcome: Outcome, ledger: str) -> None:
        """Record how the stream ended: its request's outcome and its ledger ending."""
        self.entry.end(ledger)
        if self.tag is not None:
            self.tag.set(outcome)

    async def close(self) -> None:
        """Release everything once; an ending not recorded yet is "aborted" (the client went away mid-stream: a
        client outcome at stage ``stream``)."""
        if self._done:
            return
        self._done = True
        if self.entry.outcome is None:
            log.debug("client gone mid-stream: unfinished choices cancelled in the engine (%s)", self.ctx.where())
        self.entry.end_once("aborted")
        if self.tag is not None:
            self.tag.set(Outcome.CLIENT_GONE, Stage.STREAM)
        self.ctx.active -= 1
        try:
            await self.events.aclose()  # type: ignore[attr-defined]
        finally:
            self.run.cancel_unfinished()  # a body that never started never ran its own clean-up
            try:
                await self.run.release()
            finally:
                self.ticket.release()


class _Stream(StreamingResponse):
    """A streaming response that releases its :class:`StreamEnd` when the response ends or is cancelled."""

    def __init__(self, body: AsyncIterator[bytes], end: StreamEnd, stages: StageCounts) -> None:
        super().__init__(body, media_type="text/event-stream")
        self._end = end
        self._stages = stages

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            with self._stages.inside(Stage.STREAM):
                await super().__call__(scope, receive, send)
        finally:
            await self._end.close()


async def stream(
    ctx: ServerContext,
    run: RequestRun,
    events: AsyncIterator[tuple[Any, ...]],
    s: Sampling,
    kind: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    end: StreamEnd,
) -> AsyncIterator[bytes]:
    """The event stream of one request (``kind``: ``"chat"`` or ``"completions"``); ``end`` records it answered,
    failed, or aborted when the client went away mid-stream, and releases what it holds."""
    text_of = TokenText(ctx.tok)
    rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    n = len(run.choices)
    ids: list[list[int]] = [[] for _ in range(n)]
    sent = [0] * n
    texts = [""] * n  # each choice's text so far
    done: list[ChoiceResult | None] = [None] * n
    hold = max((len(x) for x in s.stop), default=1) - 1  # text that may still become a stop string

    def chunk(
        i: int,
        text: str,
        lp_ids: Sequence[int],
        lps: Sequence[float],
        finish: str | None,
        tops: Sequence[Any] = (),
        offsets: Sequence[int] = (),
    ) -> bytes:
        if kind == "chat":
            delta: dict[str, Any] = {"content": text} if text or finish is None else {}
            choice: dict[str, Any] = {
                "index": i,
                "delta": delta,
                "logprobs": text_of.chat_logprobs(lp_ids, lps, s, tops) if lp_ids else None,
                "finish_reason": finish,
            }
        else:
            lpo = None
            if s.logprobs and lp_ids:
                lpo = text_of.completion_logprobs(lp_ids, lps, tops, s, offsets)
            choice = {"index": i, "text": text, "logprobs": lpo, "finish_reason": finish}
        if finish is not None:
            o = done[i]
            assert o is not None
            choice["stop_reason"] = o.stop_reason
            choice["token_ids"] = list(o.token_ids)
            choice["weight_versions"] = list(o.weight_versions)
        return sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})

    try:
        if kind == "chat":
            for i in range(n):
                first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                yield sse(
                    {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [{**first, "finish_reason": None}],
                    }
                )
        async for ev in events:
            i = ev[1]
            if ev[0] == "token":
                if done[i] is not None:
                    continue
                before = len(texts[i])  # where this token starts in the choice's text
                ids[i].append(ev[2])
                texts[i] = run.choices[i].detok(ids[i])
                text, hit = _cut(texts[i], s.stop)
                upto = len(text) if hit is not None else max(sent[i], len(text) - hold)
                delta = text[sent[i] : upto]
                sent[i] = max(sent[i], upto)
                top = [ev[5]] if len(ev) > 5 else []
                yield chunk(i, delta, [ev[2]], [ev[3]], None, top, [min(before, len(text))])
            else:
                o = ev[2]
                done[i] = o
                rest = o.text[sent[i] :]
                sent[i] = len(o.text)
                yield chunk(i, rest, [], [], o.finish_reason)
        if s.include_usage:
            outs = [o for o in done if o is not None]
            yield sse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage(prompts, outs, [], ctx.count_tokens),
                }
            )
        end.ended(Outcome.ANSWERED, "answered")
        yield b"data: [DONE]\n\n"
    except ServerStopping:
        end.ended(Outcome.SHUTTING_DOWN, "failed")
        err = {"message": "the server is shutting down", "type": "service_unavailable", "param": None}
        yield sse({"error": {**err, "code": "shutting_down"}})
    except Exception as exc:  # the engine failed under the request: the stream ends with an error event
        end.ended(Outcome.ERROR, "failed")
        log.exception("stream failed (%s)", ctx.where())
        msg = f"internal error: {type(exc).__name__}: {short(str(exc), 200)}"
        yield sse({"error": {"message": msg, "type": "server_error", "param": None, "code": None}})
    finally:
        await end.close()  # before its end: the client went away, the choices are cancelled


__all__ = ["start_stream", "stream"]
