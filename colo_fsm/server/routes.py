"""The OpenAI-compatible endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``,
``/tokenize`` and ``/detokenize`` (also under ``/v1``), ``/v1/models`` and ``/v1/models/{id}``."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from colo_fsm.server.context import ServerContext
from colo_fsm.server.formatting import TokenText, usage, versions
from colo_fsm.server.http_errors import error_response
from colo_fsm.server.messages import read_messages
from colo_fsm.server.params import MAX_TOKENS_LIMIT, BadRequest, read_sampling, short
from colo_fsm.server.runner import ChoiceResult
from colo_fsm.server.streaming import start_stream


def _unsupported(param: str) -> bool:
    raise BadRequest(param, "is not supported by this server")


def _responses_prompt(ctx: ServerContext, msgs: list[dict[str, str]], instructions: str | None, raw: Any) -> str:
    """The chat template's text for a ``/v1/responses`` request; a refusal names ``instructions`` or
    ``input[.i...]`` (the fields of this endpoint), not the chat messages they became."""
    try:
        return ctx.chat_prompt(msgs)
    except BadRequest as exc:
        head, _, rest = exc.param.partition(".")
        if head != "messages":
            raise
        index, _, tail = rest.partition(".")
        message = str(exc).removeprefix(f"{exc.param}: ")
        if not index.isdigit():
            raise BadRequest("input", message) from None
        i = int(index) - (1 if instructions else 0)
        if i < 0:
            raise BadRequest("instructions", message) from None
        param = f"input.{i}" + (f".{tail}" if tail else "") if isinstance(raw, list) else "input"
        raise BadRequest(param, message) from None


def _blame_instructions(
    ctx: ServerContext, msgs: list[dict[str, str]], instructions: str | None, s: Any, exc: BadRequest
) -> BadRequest:
    """``exc`` (a refusal of the rendered ``/v1/responses`` prompt, naming ``input``) renamed to ``instructions``
    when the input alone would be accepted (it encodes and fits the context and the request bound with one output
    token): the instructions make the prompt unusable, not the input."""
    if not instructions or exc.param != "input":
        return exc
    try:
        alone = ctx.encode(ctx.chat_prompt(msgs[1:]), "input")
        ctx.check_fit([alone], replace(s, max_tokens=1), "input")
    except BadRequest:
        return exc  # the input is at fault by itself
    return BadRequest("instructions", str(exc).removeprefix("input: "))


def add_routes(app: FastAPI, ctx: ServerContext) -> None:
    """Register every generation, tokenizer and model endpoint of ``app`` over ``ctx``."""
    cfg = ctx.cfg
    text_of = TokenText(ctx.tok)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Any:
        body = await ctx.read(request)
        model = body.get_str("model", None) or ctx.model_name
        raw_prompt = body.raw("prompt")
        if raw_prompt is None:
            raise BadRequest("prompt", "is required")
        s = read_sampling(body, chat=False, default_max_tokens=cfg.default_max_tokens, max_top_logprobs=ctx.max_top)
        body.finish()
        ctx.policy(s)
        texts: list[str] = []
        if ctx.engine is None:
            if isinstance(raw_prompt, str):
                texts = [raw_prompt]
            elif isinstance(raw_prompt, list) and raw_prompt and all(isinstance(x, str) for x in raw_prompt):
                texts = list(raw_prompt)
            else:
                ctx.need_engine("prompt", "a token-id prompt")
                raise AssertionError  # pragma: no cover
            outs = await ctx.legacy(texts, s, ctx.text_cost(texts, s, "prompt"))
            prompts: list[list[int]] | None = None
        else:
            prompts, _ = ctx.prompt_list(raw_prompt)
            cost = ctx.check_fit(prompts, s, "prompt")
            if s.stream:
                return await start_stream(ctx, request, prompts, s, "completions", model, cost)
            outs = await ctx.run(request, prompts, s, cost)

        def logprobs(o: ChoiceResult) -> dict[str, Any] | None:
            if not s.logprobs:
                return None
            offsets = text_of.offsets(o.token_ids, o.text)
            return text_of.completion_logprobs(o.token_ids, o.logprobs, o.top_logprobs, s, offsets)

        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex[:24]}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": o.index,
                        "text": o.text,
                        "logprobs": logprobs(o),
                        "finish_reason": o.finish_reason,
                        "stop_reason": o.stop_reason,
                        "prompt_token_ids": list(o.prompt_ids) if prompts is not None else None,
                        "token_ids": list(o.token_ids),
                        "weight_versions": list(o.weight_versions),
                    }
                    for o in outs
                ],
                "usage": usage(prompts, outs, texts, ctx.count_tokens),
                "weight_version": versions(outs),
            }
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await ctx.read(request)
        model = body.get_str("model", None) or ctx.model_name
        msgs = read_messages(body.raw("messages"))
        s = read_sampling(body, chat=True, default_max_tokens=cfg.default_max_tokens, max_top_logprobs=ctx.max_top)
        body.finish()
        ctx.policy(s)
        prompt = ctx.chat_prompt(msgs)
        if ctx.engine is None:
            outs = await ctx.legacy([prompt], s, ctx.text_cost([prompt], s, "messages"))
            prompts: list[list[int]] | None = None
        else:
            prompts = [ctx.encode(prompt, "messages")]
            cost = ctx.check_fit(prompts, s, "messages")
            if s.stream:
                return await start_stream(ctx, request, prompts, s, "chat", model, cost)
            outs = await ctx.run(request, prompts, s, cost)
        return JSONResponse(
            {
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
                        "logprobs": text_of.chat_logprobs(o.token_ids, o.logprobs, s, o.top_logprobs),
                        "token_ids": list(o.token_ids),
                        "weight_versions": list(o.weight_versions),
                    }
                    for o in outs
                ],
                "usage": usage(prompts, outs, [prompt] if prompts is None else [], ctx.count_tokens),
                "weight_version": versions(outs),
            }
        )

    @app.post("/v1/responses", response_model=None)
    async def responses(request: Request) -> Any:
        body = await ctx.read(request)
        model = body.get_str("model", None) or ctx.model_name
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
            msgs.extend(read_messages(raw, "input"))
        else:
            raise BadRequest("input", f"expected a string or a list of messages, got {short(raw)}")
        mot = body.get_int("max_output_tokens", None, 1, MAX_TOKENS_LIMIT)
        s = read_sampling(body, chat=True, default_max_tokens=cfg.default_max_tokens, max_top_logprobs=ctx.max_top)
        if s.top_logprobs:
            raise BadRequest("top_logprobs", "not supported on /v1/responses; use /v1/chat/completions")
        if mot is not None:
            s = replace(s, max_tokens=mot)
        if s.stream:
            raise BadRequest("stream", "streaming /v1/responses is not supported; use /v1/chat/completions")
        if s.n != 1:
            raise BadRequest("n", "not a /v1/responses parameter")
        body.finish()
        ctx.policy(s)
        prompt = _responses_prompt(ctx, msgs, instructions, raw)
        if ctx.engine is None:
            outs = await ctx.legacy([prompt], s, ctx.text_cost([prompt], s, "input"))
            prompt_len = ctx.count_tokens(prompt) if ctx.count_tokens else 0
        else:
            try:
                prompts = [ctx.encode(prompt, "input")]
                cost = ctx.check_fit(prompts, s, "input")
            except BadRequest as exc:
                raise _blame_instructions(ctx, msgs, instructions, s, exc) from None
            outs = await ctx.run(request, prompts, s, cost)
            prompt_len = len(prompts[0])
        o = outs[0]
        incomplete = o.finish_reason == "length"
        return JSONResponse(
            {
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
        )

    async def tokenize(request: Request) -> dict[str, Any]:
        body = await ctx.read(request)
        body.get_str("model", None)
        if body.has("messages"):
            msgs = read_messages(body.raw("messages"))
            text = ctx.chat_prompt(msgs)
            body.get_bool("add_generation_prompt", True) or _unsupported("add_generation_prompt")
        else:
            maybe = body.get_str("prompt", None)
            if maybe is None:
                raise BadRequest("prompt", "is required (or messages)")
            text = maybe
        body.get_bool("add_special_tokens", True)
        body.get_bool("return_token_strs", False) and _unsupported("return_token_strs")
        body.finish(ignore=("tools", "chat_template_kwargs"))
        ids = ctx.encode(text, "messages" if body.has("messages") else "prompt")
        return {"count": len(ids), "max_model_len": ctx.max_len or None, "tokens": ids, "token_strs": None}

    async def detokenize(request: Request) -> dict[str, Any]:
        body = await ctx.read(request)
        body.get_str("model", None)
        ctx.need_engine("tokens", "detokenizing")
        ids = ctx.check_ids(body.raw("tokens"), "tokens")
        body.finish()
        return {"prompt": ctx.tok.detokenize(ids)}

    for prefix in ("", "/v1"):
        app.add_api_route(f"{prefix}/tokenize", tokenize, methods=["POST"])
        app.add_api_route(f"{prefix}/detokenize", detokenize, methods=["POST"])

    def _model_card() -> dict[str, Any]:
        card: dict[str, Any] = {"id": ctx.model_name, "object": "model", "created": 0, "owned_by": "colo-fsm"}
        if ctx.max_len:
            card["max_model_len"] = ctx.max_len
        return card

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def model(model_id: str) -> Any:
        if model_id != ctx.model_name:
            return error_response(
                404,
                f"model {short(model_id)} does not exist (this server has {ctx.model_name!r})",
                "invalid_request_error",
                param="model",
                code="model_not_found",
            )
        return _model_card()


__all__ = ["add_routes"]
