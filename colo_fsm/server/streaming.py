"""Server-sent-event streams of completions and chat completions: one chunk per token (text held back while it
may still become a stop string), a last chunk per choice with its finish reason, usage on request, ``[DONE]``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.responses import StreamingResponse

from colo_fsm.log import get_logger
from colo_fsm.server.context import ServerContext, Ticket
from colo_fsm.server.formatting import TokenText, sse, usage
from colo_fsm.server.ledger import LedgerEntry
from colo_fsm.server.params import Sampling, short
from colo_fsm.server.runner import ChoiceResult, RequestRun, ServerStopping, _cut

log = get_logger(__name__)


async def start_stream(
    ctx: ServerContext, prompts: Sequence[Sequence[int]], s: Sampling, kind: str, model: str, cost: int
) -> StreamingResponse:
    """Take ``cost`` tokens of the budget, admit and hand the request to the engine, then answer 200 with its
    event stream (which gives the tokens back when it ends, however it ends)."""
    if ctx.stopping():
        raise ServerStopping("shutting down")
    ticket = await ctx.hold_tokens(cost)
    run = ctx.new_run(prompts, s, ticket.time_left_s)
    ctx.active += 1
    try:
        events = await run.events()  # admitted and handed to the engine before the 200 goes out
    except BaseException:
        ctx.active -= 1
        ticket.release()
        raise
    end = StreamEnd(ctx, run, events, ticket, ctx.ledger.open())
    return _Stream(stream(ctx, run, events, s, kind, model, prompts, end), end)


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
    ) -> None:
        self.ctx = ctx
        self.run = run
        self.events = events
        self.ticket = ticket
        self.entry = entry
        self._done = False

    async def close(self) -> None:
        """Release everything once; an ending not recorded yet is "aborted" (the client went away)."""
        if self._done:
            return
        self._done = True
        self.entry.end_once("aborted")
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

    def __init__(self, body: AsyncIterator[bytes], end: StreamEnd) -> None:
        super().__init__(body, media_type="text/event-stream")
        self._end = end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
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
    entry = end.entry
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
        entry.end("answered")
        yield b"data: [DONE]\n\n"
    except ServerStopping:
        entry.end("failed")
        err = {"message": "the server is shutting down", "type": "service_unavailable", "param": None}
        yield sse({"error": {**err, "code": "shutting_down"}})
    except Exception as exc:  # the engine failed under the request: the stream ends with an error event
        entry.end("failed")
        log.exception("stream failed")
        msg = f"internal error: {type(exc).__name__}: {short(str(exc), 200)}"
        yield sse({"error": {"message": msg, "type": "server_error", "param": None, "code": None}})
    finally:
        await end.close()  # before its end: the client went away, the choices are cancelled


__all__ = ["start_stream", "stream"]
