"""The OpenAI-compatible HTTP front over the colocated engine.

Endpoints: ``POST /v1/completions``, ``/v1/chat/completions`` (both with SSE streaming), ``/v1/responses``
(text in, text out), ``POST /tokenize`` and ``/detokenize`` (also under ``/v1``), ``GET /v1/models``,
``/v1/models/{id}`` and ``/health``. Requests are handed to the engine only through the
:class:`~colo_fsm.server.gate.SuspendGate`: while the engine is suspended they wait (up to
``request_timeout_s``, then 503 with ``Retry-After``); after teardown they get a 503 without it. Every error,
404 and 405 included, uses OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` and names the
field; nothing the server does not implement is ignored silently (400 naming it).

Over an engine with the request-level ``submit()`` every feature is available (token-id prompts, per-token
log-probs, stop strings, streaming). Over a plain :class:`~colo_fsm.adapters.protocols.TextGenerator` only
text prompts without those features are served; the others get a 400 naming the parameter.
"""

from __future__ import annotations

import inspect
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from colo_fsm.adapters.protocols import Completion, TextGenerator
from colo_fsm.errors import ConfigError, EngineStopped, ServerUnavailable
from colo_fsm.log import get_logger
from colo_fsm.server.gate import SuspendGate
from colo_fsm.server.params import (
    MAX_N,
    MAX_TOKENS_LIMIT,
    MAX_TOP_LOGPROBS,
    BadRequest,
    Body,
    OnPolicy,
    Sampling,
    parse_json,
    read_sampling,
    short,
)
from colo_fsm.server.runner import (
    ChoiceResult,
    ClientGone,
    RequestRun,
    ServerStopping,
    _cut,
    check_request_size,
)

log = get_logger(__name__)

DEFAULT_MAX_REQUEST_TOKENS = 1 << 15
ChatTemplate = Callable[[Sequence[Mapping[str, str]]], str]


def default_chat_template(messages: Sequence[Mapping[str, str]]) -> str:
    """``"<role>: <content>"`` lines followed by ``"assistant:"``; pass your tokenizer's template instead."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


@dataclass(frozen=True)
class ServerSettings:
    """Limits and policies of one server.

    ``max_request_tokens`` bounds ``prompts x n x max_tokens`` per request (400 beyond it, so one request cannot
    hold the engine long enough to starve training); ``on_policy`` refuses requests whose temperature or top_p
    differ from the training rollouts'; ``inflight`` is ``"park"`` (a suspend parks admitted requests in the
    engine) or ``"drain"`` (a suspend waits for them).
    """

    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    on_policy: OnPolicy | None = None
    inflight: str = "park"
    default_max_tokens: int = 16

    def __post_init__(self) -> None:
        v = self.max_request_tokens
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError("max_request_tokens", v, "a positive integer (prompts x n x max_tokens per request)")
        if self.inflight not in ("park", "drain"):
            raise ConfigError("inflight", self.inflight, "'park' or 'drain'")
        if self.on_policy is not None and not isinstance(self.on_policy, OnPolicy):
            raise ConfigError("on_policy", self.on_policy, "an OnPolicy(temperature, top_p) or None")


def _error(
    status: int,
    message: str,
    err_type: str,
    param: str | None = None,
    code: str | int | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    return obj


def _text_of(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts (``text``/``input_text``/``output_text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(where, f"expected a string or a list of text parts, got {short(content)}")
    parts = []
    for j, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type") not in ("text", "input_text", "output_text")
            or not isinstance(part.get("text"), str)
        ):
            raise BadRequest(f"{where}.{j}", "only {'type': 'text', 'text': str} parts are supported")
        parts.append(part["text"])
    return "".join(parts)


_ROLES = ("system", "user", "assistant", "tool", "developer")


def _messages(value: Any, key: str = "messages") -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise BadRequest(key, "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        b = Body(m, f"{key}.{i}")
        role = b.get_str("role", None)
        if role not in _ROLES:
            raise BadRequest(f"{key}.{i}.role", f"expected one of {list(_ROLES)}, got {short(role)}")
        text = _text_of(b.raw("content"), f"{key}.{i}.content")
        b.get_str("name", None)
        b.finish(ignore=("type", "id", "status", "annotations"))
        out.append({"role": role, "content": text})
    return out


def create_app(
    generator: TextGenerator | Any,
    *,
    gate: SuspendGate | None = None,
    model_name: str = "colo-fsm",
    request_timeout_s: float = 30.0,
    retry_after_s: int = 1,
    status: Callable[[], Any] | None = None,
    chat_template: ChatTemplate = default_chat_template,
    count_tokens: Callable[[str], int] | None = None,
    tokenizer: Any = None,
    settings: ServerSettings | None = None,
    stopping: Callable[[], bool] | None = None,
) -> FastAPI:
    """Build the FastAPI app (no socket yet); :class:`~colo_fsm.server.server.OpenAIServer` runs it.

    ``generator`` is an engine with ``submit()`` (every feature) or a ``TextGenerator``; ``tokenizer``
    (default: ``generator.tokenizer``) encodes prompts and chat templates. ``status`` (e.g.
    ``lifecycle.status``) feeds ``/health``; ``stopping()`` says a teardown began. Any model name is accepted
    and echoed back; ``/v1/models`` lists ``model_name``.
    """
    if not callable(getattr(generator, "generate", None)) and not callable(getattr(generator, "submit", None)):
        raise ConfigError("generator", generator, "an engine with submit() or a TextGenerator (with generate())")
    if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, int | float) or request_timeout_s < 0:
        raise ConfigError("request_timeout_s", request_timeout_s, "a non-negative number of seconds")
    if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int) or retry_after_s < 1:
        raise ConfigError("retry_after_s", retry_after_s, "a positive whole number of seconds")
    cfg = settings or ServerSettings()
    the_gate = gate if gate is not None else SuspendGate(name="server", is_open=True)
    engine: Any = generator if callable(getattr(generator, "submit", None)) else None
    tok: Any = tokenizer if tokenizer is not None else getattr(generator, "tokenizer", None)
    max_len = int(getattr(generator, "max_sequence_length", 0) or 0)
    max_top = _max_top_logprobs(engine)
    agenerate = getattr(generator, "agenerate", None)
    use_async = inspect.iscoroutinefunction(agenerate)
    served = {"completions": 0, "chat": 0, "responses": 0, "unavailable": 0, "bad_request": 0, "errors": 0}
    app = FastAPI(title="colo-fsm OpenAI-compatible server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.active = 0  # requests handed to the engine and not answered yet (shutdown waits for them)

    def _stopping() -> bool:
        return the_gate.retired or bool(stopping and stopping())

    # ------------------------------------------------------------------ errors (OpenAI's shape everywhere)
    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            msg = f"no route {request.method} {short(request.url.path, 80)}"
            return _error(404, msg, "invalid_request_error", code="not_found")
        if exc.status_code == 405:
            msg = f"method {request.method} not allowed on {short(request.url.path, 80)}"
            return _error(405, msg, "invalid_request_error", code="method_not_allowed", headers=exc.headers)
        return _error(exc.status_code, short(str(exc.detail), 200), "invalid_request_error")

    @app.exception_handler(BadRequest)
    async def _bad(_request: Request, exc: BadRequest) -> JSONResponse:
        served["bad_request"] += 1
        return _error(400, str(exc), "invalid_request_error", param=exc.param)

    @app.exception_handler(ServerUnavailable)
    async def _unavailable(_request: Request, exc: ServerUnavailable) -> JSONResponse:
        served["unavailable"] += 1
        if _stopping():
            return _shutting_down()
        return _error(
            503, str(exc), "service_unavailable", code="engine_suspended", headers={"Retry-After": str(retry_after_s)}
        )

    def _shutting_down() -> JSONResponse:
        return _error(503, "the server is shutting down; do not retry", "service_unavailable", code="shutting_down")

    @app.exception_handler(EngineStopped)
    @app.exception_handler(ServerStopping)
    async def _stopping_handler(_request: Request, _exc: Exception) -> JSONResponse:
        served["unavailable"] += 1
        return _shutting_down()

    @app.exception_handler(ClientGone)
    async def _gone(_request: Request, _exc: ClientGone) -> JSONResponse:
        return _error(499, "client closed the request; it was cancelled in the engine", "client_closed_request")

    @app.exception_handler(ConfigError)
    async def _config(_request: Request, exc: ConfigError) -> JSONResponse:
        served["bad_request"] += 1
        msg = f"{exc.field}={short(exc.value)}: expected {short(exc.expected, 200)}"
        return _error(400, msg, "invalid_request_error", param=exc.field)

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception) -> JSONResponse:
        served["errors"] += 1
        log.exception("request failed")
        return _error(500, f"internal error: {type(exc).__name__}: {short(str(exc), 200)}", "server_error")

    # ------------------------------------------------------------------ prompts
    def _need_engine(param: str, what: str) -> None:
        if engine is None or tok is None:
            raise BadRequest(param, f"{what} needs an engine with submit() and a tokenizer; this server has neither")

    def _encode(text: str, param: str) -> list[int]:
        _need_engine(param, "encoding text")
        try:
            return [int(t) for t in tok.tokenize(text)]
        except ConfigError as exc:
            raise BadRequest(param, f"{short(text)} cannot be encoded: expected {short(exc.expected, 120)}") from None

    def _check_ids(ids: Any, param: str) -> list[int]:
        vocab = getattr(tok, "vocab_size", None)
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequest(param, f"expected a list of token ids, got {short(ids)}")
        for t in ids:
            if t < 0 or (vocab is not None and t >= vocab):
                raise BadRequest(param, f"token id {t} is out of range [0, {vocab})")
        return list(ids)

    def _prompt_list(value: Any) -> tuple[list[list[int]], bool]:
        """Token-id prompts from ``prompt`` (str, [str], [int] or [[int]]); and whether they came as ids."""
        if isinstance(value, str):
            return [_encode(value, "prompt")], False
        if isinstance(value, list) and value:
            if all(isinstance(x, str) for x in value):
                return [_encode(x, f"prompt.{i}") for i, x in enumerate(value)], False
            if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
                _need_engine("prompt", "a token-id prompt")
                return [_check_ids(value, "prompt")], True
            if all(isinstance(x, list) for x in value):
                _need_engine("prompt", "a token-id prompt")
                return [_check_ids(x, f"prompt.{i}") for i, x in enumerate(value)], True
        raise BadRequest("prompt", f"expected a string, a list of strings or token ids, got {short(value)}")

    def _check_fit(prompts: Sequence[Sequence[int]], s: Sampling) -> None:
        check_request_size(len(prompts), s, cfg.max_request_tokens)
        if max_len:
            for i, p in enumerate(prompts):
                if not p:
                    raise BadRequest("prompt", "empty prompt")
                if len(p) + s.max_tokens > max_len:
                    raise BadRequest(
                        "max_tokens",
                        f"this model's maximum context length is {max_len} tokens; prompt {i} has {len(p)} and "
                        f"max_tokens is {s.max_tokens}",
                    )

    def _policy(s: Sampling) -> None:
        if cfg.on_policy is not None:
            cfg.on_policy.check(s)

    async def _read(request: Request) -> Body:
        return Body(parse_json(await request.body()))

    def _new_run(prompts: Sequence[Sequence[int]], s: Sampling) -> RequestRun:
        assert engine is not None and tok is not None
        return RequestRun(
            engine,
            tok.detokenize,
            the_gate,
            prompts,
            s,
            timeout_s=request_timeout_s,
            hold_gate=cfg.inflight == "drain",
        )

    async def _legacy(prompts: list[str], s: Sampling) -> list[ChoiceResult]:
        """A TextGenerator without submit(): text in, text out, holding the gate for the whole call."""
        for param, on in (
            ("stream", s.stream),
            ("logprobs", s.logprobs),
            ("top_logprobs", s.top_logprobs > 0),
            ("stop", bool(s.stop)),
            ("stop_token_ids", bool(s.stop_token_ids)),
            ("top_p", s.top_p != 1.0),
            ("top_k", s.top_k != 0),
        ):
            if on:
                raise BadRequest(param, "not supported by this generator (needs an engine with submit())")
        expanded = [p for p in prompts for _ in range(s.n)]
        async with the_gate.admit_async(request_timeout_s):
            if use_async and agenerate is not None:
                outs = await agenerate(expanded, max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed)
            else:
                outs = await anyio.to_thread.run_sync(
                    lambda: generator.generate(
                        expanded, max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed
                    )
                )
        outs = list(outs)
        if len(outs) != len(expanded) or not all(isinstance(o, Completion) for o in outs):
            raise RuntimeError(
                f"generator returned {len(outs)} results for {len(expanded)} prompts (expected one Completion each)"
            )
        return [
            ChoiceResult(
                i, (), tuple(o.token_ids), tuple(getattr(o, "logprobs", ()) or ()), (), o.text, o.finish_reason
            )
            for i, o in enumerate(outs)
        ]

    async def _run(request: Request, prompts: list[list[int]], s: Sampling) -> list[ChoiceResult]:
        if _stopping():
            raise ServerStopping("shutting down")
        run = _new_run(prompts, s)
        app.state.active += 1
        try:
            await run.start()
            return await run.wait(request.is_disconnected)
        except ClientGone:
            log.info("client disconnected: %d choice(s) cancelled in the engine", len(run.choices))
            raise
        finally:
            app.state.active -= 1

    def _usage(
        prompts: Sequence[Sequence[int]] | None, outs: Sequence[ChoiceResult], texts: Sequence[str]
    ) -> dict[str, int]:
        if prompts is not None:
            prompt_tokens = sum(len(p) for p in prompts)  # each prompt once, whatever n
        else:
            prompt_tokens = sum(count_tokens(t) for t in texts) if count_tokens else 0
        completion_tokens = sum(len(o.token_ids) for o in outs)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _tok_str(t: int, s: Sampling) -> str:
        if s.tokens_as_ids:
            return f"token_id:{t}"
        if tok is None:
            return str(t)
        try:
            return str(tok.detokenize([t], skip_special_tokens=False))
        except TypeError:
            return str(tok.detokenize([t]))

    def _top_dicts(tops: Sequence[Any], n: int, s: Sampling) -> list[dict[str, float]] | None:
        """Completions' ``top_logprobs``: per token, ``{token text: logprob}`` of its alternatives."""
        if not s.top_logprobs:
            return None
        padded = list(tops) + [()] * (n - len(tops))
        return [{_tok_str(t, s): float(v) for t, v in top} for top in padded[:n]]

    def _completion_logprobs(o: ChoiceResult, s: Sampling) -> dict[str, Any] | None:
        if not s.logprobs:
            return None
        toks = [_tok_str(t, s) for t in o.token_ids]
        offsets, pos = [], 0
        for t in toks:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": toks,
            "token_logprobs": list(o.logprobs),
            "top_logprobs": _top_dicts(o.top_logprobs, len(toks), s),
            "text_offset": offsets,
        }

    def _chat_logprobs(
        ids: Sequence[int], lps: Sequence[float], s: Sampling, tops: Sequence[Any] = ()
    ) -> dict[str, Any] | None:
        if not s.logprobs:
            return None
        content = []
        padded = list(tops) + [()] * (len(ids) - len(tops))
        for t, lp, top in zip(ids, lps, padded):
            ts = _tok_str(t, s)
            alts = []
            for at, av in top if s.top_logprobs else ():
                a_s = _tok_str(at, s)
                alts.append({"token": a_s, "logprob": float(av), "bytes": list(a_s.encode("utf-8"))})
            content.append({"token": ts, "logprob": lp, "bytes": list(ts.encode("utf-8")), "top_logprobs": alts})
        return {"content": content, "refusal": None}

    def _versions(outs: Sequence[ChoiceResult]) -> int | None:
        vs = [v for o in outs for v in o.weight_versions]
        return min(vs) if vs else None

    # ------------------------------------------------------------------ streaming
    def _sse(obj: Any) -> bytes:
        return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()

    async def _start_stream(
        run: RequestRun, s: Sampling, kind: str, model: str, prompts: Sequence[Sequence[int]]
    ) -> Any:
        if _stopping():
            raise ServerStopping("shutting down")
        app.state.active += 1
        try:
            events = await run.events()  # admitted and handed to the engine before the 200 goes out
        except BaseException:
            app.state.active -= 1
            raise
        return StreamingResponse(_stream(run, events, s, kind, model, prompts), media_type="text/event-stream")

    async def _stream(
        run: RequestRun,
        events: AsyncIterator[tuple[Any, ...]],
        s: Sampling,
        kind: str,
        model: str,
        prompts: Sequence[Sequence[int]],
    ) -> AsyncIterator[bytes]:
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        n = len(run.choices)
        ids: list[list[int]] = [[] for _ in range(n)]
        sent = [0] * n
        done: list[ChoiceResult | None] = [None] * n
        hold = max((len(x) for x in s.stop), default=1) - 1  # text that may still become a stop string

        def chunk(
            i: int,
            text: str,
            lp_ids: Sequence[int],
            lps: Sequence[float],
            finish: str | None,
            tops: Sequence[Any] = (),
        ) -> bytes:
            if kind == "chat":
                delta: dict[str, Any] = {"content": text} if text or finish is None else {}
                choice: dict[str, Any] = {
                    "index": i,
                    "delta": delta,
                    "logprobs": _chat_logprobs(lp_ids, lps, s, tops) if lp_ids else None,
                    "finish_reason": finish,
                }
            else:
                lpo = None
                if s.logprobs and lp_ids:
                    lpo = {
                        "tokens": [_tok_str(t, s) for t in lp_ids],
                        "token_logprobs": list(lps),
                        "top_logprobs": _top_dicts(tops, len(lp_ids), s),
                        "text_offset": [],
                    }
                choice = {"index": i, "text": text, "logprobs": lpo, "finish_reason": finish}
            if finish is not None:
                o = done[i]
                assert o is not None
                choice["stop_reason"] = o.stop_reason
                choice["token_ids"] = list(o.token_ids)
                choice["weight_versions"] = list(o.weight_versions)
            return _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})

        try:
            if kind == "chat":
                for i in range(n):
                    yield _sse(
                        {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [
                                {
                                    "index": i,
                                    "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
            async for ev in events:
                i = ev[1]
                if ev[0] == "token":
                    if done[i] is not None:
                        continue
                    ids[i].append(ev[2])
                    text = run.choices[i].detok(ids[i])
                    text, hit = _cut(text, s.stop)
                    upto = len(text) if hit is not None else max(sent[i], len(text) - hold)
                    delta = text[sent[i] : upto]
                    sent[i] = max(sent[i], upto)
                    yield chunk(i, delta, [ev[2]], [ev[3]], None, [ev[5]] if len(ev) > 5 else [])
                else:
                    o = ev[2]
                    done[i] = o
                    rest = o.text[sent[i] :]
                    sent[i] = len(o.text)
                    yield chunk(i, rest, [], [], o.finish_reason)
            if s.include_usage:
                outs = [o for o in done if o is not None]
                yield _sse(
                    {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(prompts, outs, []),
                    }
                )
            yield b"data: [DONE]\n\n"
        except ServerStopping:
            yield _sse(
                {
                    "error": {
                        "message": "the server is shutting down",
                        "type": "service_unavailable",
                        "param": None,
                        "code": "shutting_down",
                    }
                }
            )
        finally:
            app.state.active -= 1
            await events.aclose()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ endpoints
    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Any:
        body = await _read(request)
        model = body.get_str("model", None) or model_name
        raw_prompt = body.raw("prompt")
        if raw_prompt is None:
            raise BadRequest("prompt", "is required")
        s = read_sampling(body, chat=False, default_max_tokens=cfg.default_max_tokens, max_top_logprobs=max_top)
        body.finish()
        _policy(s)
        if engine is None:
            if isinstance(raw_prompt, str):
                texts = [raw_prompt]
            elif isinstance(raw_prompt, list) and raw_prompt and all(isinstance(x, str) for x in raw_prompt):
                texts = list(raw_prompt)
            else:
                _need_engine("prompt", "a token-id prompt")
                raise AssertionError  # pragma: no cover
            check_request_size(len(texts), s, cfg.max_request_tokens)
            outs = await _legacy(texts, s)
            prompts: list[list[int]] | None = None
        else:
            prompts, _ = _prompt_list(raw_prompt)
            _check_fit(prompts, s)
            if s.stream:
                return await _start_stream(_new_run(prompts, s), s, "completions", model, prompts)
            outs = await _run(request, prompts, s)
            texts = []
        served["completions"] += 1
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": o.index,
                    "text": o.text,
                    "logprobs": _completion_logprobs(o, s),
                    "finish_reason": o.finish_reason,
                    "stop_reason": o.stop_reason,
                    "prompt_token_ids": list(o.prompt_ids) if prompts is not None else None,
                    "token_ids": list(o.token_ids),
                    "weight_versions": list(o.weight_versions),
                }
                for o in outs
            ],
            "usage": _usage(prompts, outs, texts),
            "weight_version": _versions(outs),
        }

    def _chat_prompt(msgs: list[dict[str, str]]) -> str:
        try:
            return chat_template(msgs)
        except BadRequest:
            raise
        except (ConfigError, ValueError, KeyError) as exc:
            raise BadRequest("messages", f"the chat template cannot render them: {short(str(exc), 120)}") from None

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await _read(request)
        model = body.get_str("model", None) or model_name
        msgs = _messages(body.raw("messages"))
        s = read_sampling(body, chat=True, default_max_tokens=cfg.default_max_tokens, max_top_logprobs=max_top)
        body.finish()
        _policy(s)
        prompt = _chat_prompt(msgs)
        if engine is None:
            check_request_size(1, s, cfg.max_request_tokens)
            outs = await _legacy([prompt], s)
            prompts: list[list[int]] | None = None
        else:
            prompts = [_encode(prompt, "messages")]
            _check_fit(prompts, s)
            if s.stream:
                return await _start_stream(_new_run(prompts, s), s, "chat", model, prompts)
            outs = await _run(request, prompts, s)
        served["chat"] += 1
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "prompt_token_ids": list(prompts[0]) if prompts is not None else None,
            "choices": [
                {
                    "index": o.index,
                    "message": {"role": "assistant", "content": o.text, "tool_calls": []},
                    "finish_reason": o.finish_reason,
                    "stop_reason": o.stop_reason,
                    "logprobs": _chat_logprobs(o.token_ids, o.logprobs, s, o.top_logprobs),
                    "token_ids": list(o.token_ids),
                    "weight_versions": list(o.weight_versions),
                }
                for o in outs
            ],
            "usage": _usage(prompts, outs, [prompt] if prompts is None else []),
            "weight_version": _versions(outs),
        }

    @app.post("/v1/responses", response_model=None)
    async def responses(request: Request) -> Any:
        body = await _read(request)
        model = body.get_str("model", None) or model_name
        raw = body.raw("input")
        if raw is None:
            raise BadRequest("input", "is required")
        msgs: list[dict[str, str]] = []
        instructions = body.get_str("instructions", None)
        if instructions:
            msgs.append({"role": "system", "content": instructions})
        if isinstance(raw, str):
            msgs.append({"role": "user", "content": raw})
        elif isinstance(raw, list):
            for i, item in enumerate(raw):
                if isinstance(item, dict) and item.get("type", "message") != "message":
                    raise BadRequest(f"input.{i}.type", f"{short(item.get('type'))} is not supported (only messages)")
            msgs.extend(_messages(raw, "input"))
        else:
            raise BadRequest("input", f"expected a string or a list of messages, got {short(raw)}")
        mot = body.get_int("max_output_tokens", None, 1, MAX_TOKENS_LIMIT)
        s = read_sampling(body, chat=True, default_max_tokens=cfg.default_max_tokens, max_top_logprobs=max_top)
        if s.top_logprobs:
            raise BadRequest("top_logprobs", "not supported on /v1/responses; use /v1/chat/completions")
        if mot is not None:
            s = replace(s, max_tokens=mot)
        if s.stream:
            raise BadRequest("stream", "streaming /v1/responses is not supported; use /v1/chat/completions")
        if s.n != 1:
            raise BadRequest("n", "not a /v1/responses parameter")
        body.finish()
        _policy(s)
        prompt = _chat_prompt(msgs)
        if engine is None:
            outs = await _legacy([prompt], s)
            prompt_len = count_tokens(prompt) if count_tokens else 0
        else:
            prompts = [_encode(prompt, "input")]
            _check_fit(prompts, s)
            outs = await _run(request, prompts, s)
            prompt_len = len(prompts[0])
        o = outs[0]
        served["responses"] += 1
        incomplete = o.finish_reason == "length"
        return {
            "id": f"resp_{uuid.uuid4().hex[:24]}",
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "instructions": instructions,
            "output": [
                {
                    "type": "message",
                    "id": f"msg_{uuid.uuid4().hex[:24]}",
                    "role": "assistant",
                    "status": "incomplete" if incomplete else "completed",
                    "content": [{"type": "output_text", "text": o.text, "annotations": []}],
                }
            ],
            "parallel_tool_calls": False,
            "tool_choice": "none",
            "tools": [],
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_output_tokens": s.max_tokens,
            "usage": {
                "input_tokens": prompt_len,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": len(o.token_ids),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt_len + len(o.token_ids),
            },
            "prompt_token_ids": list(o.prompt_ids),
            "token_ids": list(o.token_ids),
            "logprobs": list(o.logprobs),
            "weight_versions": list(o.weight_versions),
        }

    async def tokenize(request: Request) -> dict[str, Any]:
        body = await _read(request)
        body.get_str("model", None)
        if body.has("messages"):
            msgs = _messages(body.raw("messages"))
            text = _chat_prompt(msgs)
            body.get_bool("add_generation_prompt", True) or _unsupported("add_generation_prompt")
        else:
            maybe = body.get_str("prompt", None)
            if maybe is None:
                raise BadRequest("prompt", "is required (or messages)")
            text = maybe
        body.get_bool("add_special_tokens", True)
        body.get_bool("return_token_strs", False) and _unsupported("return_token_strs")
        body.finish(ignore=("tools", "chat_template_kwargs"))
        ids = _encode(text, "messages" if body.has("messages") else "prompt")
        return {"count": len(ids), "max_model_len": max_len or None, "tokens": ids, "token_strs": None}

    async def detokenize(request: Request) -> dict[str, Any]:
        body = await _read(request)
        body.get_str("model", None)
        _need_engine("tokens", "detokenizing")
        ids = _check_ids(body.raw("tokens"), "tokens")
        body.finish()
        return {"prompt": tok.detokenize(ids)}

    for prefix in ("", "/v1"):
        app.add_api_route(f"{prefix}/tokenize", tokenize, methods=["POST"])
        app.add_api_route(f"{prefix}/detokenize", detokenize, methods=["POST"])

    def _model_card() -> dict[str, Any]:
        card: dict[str, Any] = {"id": model_name, "object": "model", "created": 0, "owned_by": "colo-fsm"}
        if max_len:
            card["max_model_len"] = max_len
        return card

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def model(model_id: str) -> Any:
        if model_id != model_name:
            return _error(
                404,
                f"model {short(model_id)} does not exist (this server has {model_name!r})",
                "invalid_request_error",
                param="model",
                code="model_not_found",
            )
        return _model_card()

    def _admission() -> str:
        phase = getattr(stopping, "phase", None)  # GatedEngine's: "running", "stopping", "stopped"
        if phase is not None and phase() in ("stopping", "stopped"):
            return str(phase())
        if the_gate.retired:
            return "stopped"
        if _stopping():
            return "stopping"
        return "open" if the_gate.admissible() else "closed"

    @app.get("/health", response_model=None)
    async def health() -> Any:
        admission = _admission()
        info: dict[str, Any] = {
            "status": {"open": "ok", "closed": "handoff"}.get(admission, admission),
            "admission": admission,
            "gate": the_gate.state(),
            **the_gate.counters(),
            "responses": dict(served),
            "inflight_policy": cfg.inflight,
        }
        if engine is not None and callable(getattr(engine, "request_counts", None)):
            try:
                info["engine_requests"] = _jsonable(engine.request_counts())
            except Exception as exc:  # health must answer even if the engine is torn down
                info["engine_requests"] = {"error": type(exc).__name__}
        if status is not None:
            try:
                st = _jsonable(status())
            except Exception as exc:  # health must answer even if the status source is broken
                st = {"error": f"{type(exc).__name__}: {short(str(exc), 200)}"}
            info["lifecycle"] = st
            if isinstance(st, Mapping):
                info["lifecycle_state"] = st.get("state")
                info["weight_version"] = st.get("weight_version")
        code = 503 if admission in ("stopping", "stopped") else 200
        return JSONResponse(info, status_code=code)

    app.state.gate = the_gate
    app.state.served = served
    app.state.settings = cfg
    return app


def _max_top_logprobs(engine: Any) -> int:
    """How many alternatives per token ``engine`` records: its ``config.max_top_logprobs`` (default
    :data:`~colo_fsm.server.params.MAX_TOP_LOGPROBS`), or 0 when its ``submit()`` takes no ``top_logprobs``."""
    if engine is None:
        return 0
    try:
        params = inspect.signature(engine.submit).parameters
    except (TypeError, ValueError):
        return 0
    if "top_logprobs" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return 0
    return int(getattr(getattr(engine, "config", None), "max_top_logprobs", MAX_TOP_LOGPROBS))


def _unsupported(param: str) -> bool:
    raise BadRequest(param, "is not supported by this server")


__all__ = [
    "DEFAULT_MAX_REQUEST_TOKENS",
    "MAX_N",
    "BadRequest",
    "ChatTemplate",
    "ServerSettings",
    "create_app",
    "default_chat_template",
]
