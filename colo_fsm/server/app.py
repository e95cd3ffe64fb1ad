"""The OpenAI-compatible HTTP front over a :class:`~colo_fsm.adapters.protocols.TextGenerator`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.
Every request passes the :class:`~colo_fsm.server.gate.SuspendGate`: while the engine is suspended it waits
(up to ``request_timeout_s``) and then gets a 503 with ``Retry-After``. Malformed requests get a 400 whose
message names the field, in OpenAI's error shape. Streaming is not supported (400).
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any, Literal

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from colo_fsm.adapters.protocols import Completion, TextGenerator
from colo_fsm.errors import BadRequest, ConfigError, ServerUnavailable
from colo_fsm.log import get_logger
from colo_fsm.server.gate import SuspendGate

log = get_logger(__name__)

MAX_N = 64
MAX_TOKENS_LIMIT = 1 << 16


class _Req(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = None
    stream: bool = False
    user: str | None = None


class CompletionRequest(_Req):
    """Body of ``POST /v1/completions`` (text prompts only)."""

    prompt: str | list[str]


class ChatMessage(BaseModel):
    """One chat message; ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Req):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)


def default_chat_template(messages: Sequence[Mapping[str, str]]) -> str:
    """``"<role>: <content>"`` lines followed by ``"assistant:"``; pass your tokenizer's template instead."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def _error(
    status: int,
    message: str,
    err_type: str,
    param: str | None = None,
    code: str | None = None,
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


def _param_of(errors: list[Any]) -> str:
    """The field an error names, e.g. ``max_tokens`` or ``messages.0.role``; union members are left out."""
    locs = [[str(p) for p in e.get("loc", ()) if p != "body"] for e in errors]
    head = locs[0][:1]
    same = [loc for loc in locs if loc[:1] == head]  # one field may fail once per union member
    common: list[str] = []
    for parts in zip(*same):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common) if common else "body"


def _text_of(content: str | list[dict[str, Any]] | None, idx: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequest(f"messages.{idx}.content.{j}", "only {'type': 'text', 'text': str} parts are supported")
        parts.append(part["text"])
    return "".join(parts)


def create_app(
    generator: TextGenerator,
    *,
    gate: SuspendGate | None = None,
    model_name: str = "colo-fsm",
    request_timeout_s: float = 30.0,
    retry_after_s: int = 1,
    status: Callable[[], Any] | None = None,
    chat_template: Callable[[Sequence[Mapping[str, str]]], str] = default_chat_template,
    count_tokens: Callable[[str], int] | None = None,
) -> FastAPI:
    """Build the FastAPI app (no socket yet); :class:`OpenAIServer` runs it.

    ``status`` (e.g. ``lifecycle.status``) feeds ``/health``; ``count_tokens`` fills ``usage.prompt_tokens``
    (0 without it). Any model name is accepted and echoed back; ``/v1/models`` lists ``model_name``.
    """
    if not callable(getattr(generator, "generate", None)):
        raise ConfigError("generator", generator, "a TextGenerator (with generate())")
    if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, int | float) or request_timeout_s < 0:
        raise ConfigError("request_timeout_s", request_timeout_s, "a non-negative number of seconds")
    if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int) or retry_after_s < 1:
        raise ConfigError("retry_after_s", retry_after_s, "a positive whole number of seconds")
    the_gate = gate if gate is not None else SuspendGate(name="server", is_open=True)
    agenerate = getattr(generator, "agenerate", None)
    use_async = inspect.iscoroutinefunction(agenerate)
    served = {"completions": 0, "chat": 0, "unavailable": 0, "bad_request": 0, "errors": 0}
    app = FastAPI(title="colo-fsm OpenAI-compatible server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        served["bad_request"] += 1
        errors = list(exc.errors()) or [{"loc": ("body",), "msg": "invalid request"}]
        first = errors[0]
        if first.get("type") == "json_invalid":
            param, msg = "body", f"invalid JSON ({first.get('ctx', {}).get('error', first.get('msg'))})"
        else:
            param, msg = _param_of(errors), str(first.get("msg", "invalid value"))
        return _error(400, f"{param}: {msg}", "invalid_request_error", param=param)

    @app.exception_handler(BadRequest)
    async def _bad(_request: Request, exc: BadRequest) -> JSONResponse:
        served["bad_request"] += 1
        return _error(400, str(exc), "invalid_request_error", param=exc.param)

    @app.exception_handler(ServerUnavailable)
    async def _unavailable(_request: Request, exc: ServerUnavailable) -> JSONResponse:
        served["unavailable"] += 1
        return _error(
            503, str(exc), "service_unavailable", code="engine_suspended", headers={"Retry-After": str(retry_after_s)}
        )

    @app.exception_handler(ConfigError)
    async def _config(_request: Request, exc: ConfigError) -> JSONResponse:
        served["bad_request"] += 1
        return _error(400, str(exc), "invalid_request_error", param=exc.field)

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception) -> JSONResponse:
        served["errors"] += 1
        log.exception("request failed")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    async def _generate(prompts: list[str], req: _Req, max_tokens: int) -> list[Completion]:
        if req.stream:
            raise BadRequest("stream", "streaming is not supported; send stream=false")
        async with the_gate.admit_async(request_timeout_s):
            if use_async and agenerate is not None:
                outs = await agenerate(prompts, max_tokens=max_tokens, temperature=req.temperature, seed=req.seed)
            else:
                outs = await anyio.to_thread.run_sync(
                    lambda: generator.generate(
                        prompts, max_tokens=max_tokens, temperature=req.temperature, seed=req.seed
                    )
                )
        outs = list(outs)
        if len(outs) != len(prompts) or not all(isinstance(o, Completion) for o in outs):
            raise RuntimeError(
                f"generator returned {len(outs)} results for {len(prompts)} prompts (expected one Completion each)"
            )
        return outs

    def _usage(prompts: list[str], outs: list[Completion]) -> dict[str, int]:
        prompt_tokens = sum(count_tokens(p) for p in prompts) if count_tokens else 0
        completion_tokens = sum(len(o.token_ids) for o in outs)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts:
            raise BadRequest("prompt", "at least one prompt is required")
        expanded = [p for p in prompts for _ in range(req.n)]
        outs = await _generate(expanded, req, req.max_tokens)
        served["completions"] += 1
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req.model or model_name,
            "choices": [
                {
                    "index": i,
                    "text": o.text,
                    "logprobs": None,
                    "finish_reason": o.finish_reason,
                    "token_ids": list(o.token_ids),
                }
                for i, o in enumerate(outs)
            ],
            "usage": _usage(expanded, outs),
            "weight_version": min(o.weight_version for o in outs),
        }

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest) -> dict[str, Any]:
        msgs = [{"role": m.role, "content": _text_of(m.content, i)} for i, m in enumerate(req.messages)]
        prompt = chat_template(msgs)
        max_tokens = req.max_completion_tokens or req.max_tokens
        outs = await _generate([prompt] * req.n, req, max_tokens)
        served["chat"] += 1
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model or model_name,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": o.text},
                    "finish_reason": o.finish_reason,
                    "logprobs": None,
                    "token_ids": list(o.token_ids),
                }
                for i, o in enumerate(outs)
            ],
            "usage": _usage([prompt] * req.n, outs),
            "weight_version": min(o.weight_version for o in outs),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "colo-fsm"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        info: dict[str, Any] = {
            "status": "ok" if the_gate.is_open else "suspended",
            "gate": the_gate.state(),
            **the_gate.counters(),
            "responses": dict(served),
        }
        if status is not None:
            try:
                st = _jsonable(status())
            except Exception as exc:  # health must answer even if the status source is broken
                st = {"error": f"{type(exc).__name__}: {exc}"}
            info["lifecycle"] = st
            if isinstance(st, Mapping):
                info["lifecycle_state"] = st.get("state")
                info["weight_version"] = st.get("weight_version")
        return info

    app.state.gate = the_gate
    app.state.served = served
    return app


__all__ = [
    "BadRequest",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "create_app",
    "default_chat_template",
]
