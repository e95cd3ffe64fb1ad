"""What every route of one server shares: the engine, tokenizer, gate and settings, and the steps of a request
(read the body, encode the prompt, check it fits, run it on the engine behind the gate)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio.to_thread
from starlette.requests import Request

from colo_fsm.adapters.protocols import Completion, TextGenerator
from colo_fsm.errors import ConfigError, ServerBusy, ServerUnavailable
from colo_fsm.log import get_logger
from colo_fsm.server.admission import TokenBudget, check_request_size
from colo_fsm.server.body import read_json
from colo_fsm.server.gate import SuspendGate
from colo_fsm.server.ledger import LedgerEntry, RequestLedger
from colo_fsm.server.params import MAX_TOP_LOGPROBS, BadRequest, Body, Sampling, short
from colo_fsm.server.runner import ChoiceResult, ClientGone, RequestRun, ServerStopping
from colo_fsm.server.settings import ServerSettings
from colo_fsm.server.templates import ChatTemplate

log = get_logger(__name__)


def engine_logprobs_mode(engine: Any) -> str | None:
    """The distribution ``engine`` returns log-probs of (``"raw"`` or ``"processed"``, from its ``config`` or
    itself), None when it does not say."""
    if engine is None:
        return None
    for src in (getattr(engine, "config", None), engine):
        mode = getattr(src, "logprobs_mode", None)
        if mode is not None:
            return str(getattr(mode, "value", mode))
    return None


class ServerContext:
    """One server's engine (``submit()``, or a plain ``TextGenerator``), tokenizer, gate, settings and counters."""

    def __init__(
        self,
        generator: TextGenerator | Any,
        *,
        gate: SuspendGate,
        model_name: str,
        request_timeout_s: float,
        retry_after_s: int,
        status: Callable[[], Any] | None,
        chat_template: ChatTemplate,
        count_tokens: Callable[[str], int] | None,
        tokenizer: Any,
        settings: ServerSettings,
        stopping: Callable[[], bool] | None,
    ) -> None:
        self.generator = generator
        self.gate = gate
        self.model_name = model_name
        self.request_timeout_s = float(request_timeout_s)
        self.retry_after_s = retry_after_s
        self.status = status
        self.chat_template = chat_template
        self.count_tokens = count_tokens
        self.cfg = settings
        self.stopping_source = stopping
        self.engine: Any = generator if callable(getattr(generator, "submit", None)) else None
        self.tok: Any = tokenizer if tokenizer is not None else getattr(generator, "tokenizer", None)
        self.max_len = int(getattr(generator, "max_sequence_length", 0) or 0)
        self.max_top = max_top_logprobs(self.engine)
        self.logprobs_mode = engine_logprobs_mode(self.engine)
        self.agenerate = getattr(generator, "agenerate", None)
        self.use_async = inspect.iscoroutinefunction(self.agenerate)
        self.served = {
            "completions": 0,
            "chat": 0,
            "responses": 0,
            "unavailable": 0,
            "busy": 0,
            "bad_request": 0,
            "errors": 0,
        }
        self.max_request_tokens, self.max_inflight_tokens = settings.token_limits(self.engine)
        self.budget = TokenBudget(self.max_inflight_tokens, settings.max_waiting_requests)
        self.ledger = RequestLedger()
        self.active = 0  # requests handed to the engine and not answered yet (shutdown waits for them)

    # ------------------------------------------------------------------ state
    def stopping(self) -> bool:
        """Whether a teardown began (the gate retired or the ``stopping`` source says so)."""
        return self.gate.retired or bool(self.stopping_source and self.stopping_source())

    # ------------------------------------------------------------------ prompts
    def need_engine(self, param: str, what: str) -> None:
        """400 naming ``param`` when this server has no engine with ``submit()`` and a tokenizer."""
        if self.engine is None or self.tok is None:
            raise BadRequest(param, f"{what} needs an engine with submit() and a tokenizer; this server has neither")

    def encode(self, text: str, param: str) -> list[int]:
        """``text``'s token ids; a 400 naming ``param`` when the tokenizer cannot encode it."""
        self.need_engine(param, "encoding text")
        try:
            return [int(t) for t in self.tok.tokenize(text)]
        except ConfigError as exc:
            raise BadRequest(param, f"{short(text)} cannot be encoded: expected {short(exc.expected, 120)}") from None

    def check_ids(self, ids: Any, param: str) -> list[int]:
        """``ids`` as a list of token ids in the vocabulary; a 400 naming ``param`` otherwise."""
        vocab = getattr(self.tok, "vocab_size", None)
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequest(param, f"expected a list of token ids, got {short(ids)}")
        for t in ids:
            if t < 0 or (vocab is not None and t >= vocab):
                raise BadRequest(param, f"token id {t} is out of range [0, {vocab})")
        return list(ids)

    def prompt_list(self, value: Any) -> tuple[list[list[int]], bool]:
        """Token-id prompts from ``prompt`` (str, [str], [int] or [[int]]); and whether they came as ids."""
        if isinstance(value, str):
            return [self.encode(value, "prompt")], False
        if isinstance(value, list) and value:
            if all(isinstance(x, str) for x in value):
                return [self.encode(x, f"prompt.{i}") for i, x in enumerate(value)], False
            if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
                self.need_engine("prompt", "a token-id prompt")
                return [self.check_ids(value, "prompt")], True
            if all(isinstance(x, list) for x in value):
                self.need_engine("prompt", "a token-id prompt")
                return [self.check_ids(x, f"prompt.{i}") for i, x in enumerate(value)], True
        raise BadRequest("prompt", f"expected a string, a list of strings or token ids, got {short(value)}")

    def check_fit(self, prompts: Sequence[Sequence[int]], s: Sampling, prompt_param: str) -> int:
        """The request's cost in tokens; 400 when a prompt does not fit the context (naming ``prompt_param``
        when the prompt alone is too long, else ``max_tokens``) or the cost is over ``max_request_tokens``."""
        for i, p in enumerate(prompts):
            if not p:
                raise BadRequest(prompt_param, "empty prompt")
            if self.max_len and len(p) + s.max_tokens > self.max_len:
                where = prompt_param if len(p) >= self.max_len or len(prompts) == 1 else f"{prompt_param}.{i}"
                raise BadRequest(
                    where if len(p) >= self.max_len else "max_tokens",
                    f"this model's maximum context length is {self.max_len} tokens; prompt {i} has {len(p)} "
                    f"and max_tokens is {s.max_tokens} ({len(p) + s.max_tokens} in all)",
                )
        return check_request_size([len(p) for p in prompts], s, self.max_request_tokens, prompt_param)

    def text_cost(self, texts: Sequence[str], s: Sampling, prompt_param: str) -> int:
        """A text-only generator's request cost (prompt tokens by ``count_tokens``, 0 without it); 400 over
        ``max_request_tokens``."""
        lengths = [self.count_tokens(t) if self.count_tokens else 0 for t in texts]
        return check_request_size(lengths, s, self.max_request_tokens, prompt_param)

    async def hold_tokens(self, cost: int) -> Ticket:
        """Take ``cost`` tokens of the server's :class:`TokenBudget` (waiting up to ``request_timeout_s``).

        A wait that ends while the server stops is a 503 "shutting down", while the engine is suspended a 503
        with Retry-After, otherwise a 429 with Retry-After."""
        t0 = time.monotonic()
        try:
            await self.budget.acquire(cost, self.request_timeout_s)
        except ServerBusy:
            if self.stopping():
                raise ServerStopping("shutting down") from None
            if not self.gate.admissible():
                raise ServerUnavailable(time.monotonic() - t0, self.gate.state()) from None
            raise
        return Ticket(self.budget, cost, max(0.0, self.request_timeout_s - (time.monotonic() - t0)))

    def policy(self, s: Sampling) -> None:
        """The on-policy guard, when configured."""
        if self.cfg.on_policy is not None:
            self.cfg.on_policy.check(s)

    def chat_prompt(self, msgs: list[dict[str, str]]) -> str:
        """The chat template's text for ``msgs``; a 400 naming ``messages`` when it cannot render them."""
        try:
            return self.chat_template(msgs)
        except BadRequest:
            raise
        except (ConfigError, ValueError, KeyError) as exc:
            raise BadRequest("messages", f"the chat template cannot render them: {short(str(exc), 120)}") from None

    async def read(self, request: Request) -> Body:
        """The request body as a JSON object being read (415, 413 and 400 as :mod:`~colo_fsm.server.body` says)."""
        return Body(await read_json(request, self.cfg.max_body_bytes))

    # ------------------------------------------------------------------ running
    def new_run(self, prompts: Sequence[Sequence[int]], s: Sampling, timeout_s: float | None = None) -> RequestRun:
        """The choices of one request on the engine, not started yet (waits at most ``timeout_s`` at the gate)."""
        assert self.engine is not None and self.tok is not None
        return RequestRun(
            self.engine,
            self.tok.detokenize,
            self.gate,
            prompts,
            s,
            timeout_s=self.request_timeout_s if timeout_s is None else timeout_s,
            hold_gate=self.cfg.inflight_policy == "drain",
        )

    async def run(self, request: Request, prompts: list[list[int]], s: Sampling, cost: int) -> list[ChoiceResult]:
        """Run a non-streamed request to the end, holding ``cost`` tokens of the budget (cancelled in the engine
        if the client goes away)."""
        if self.stopping():
            raise ServerStopping("shutting down")
        ticket = await self.hold_tokens(cost)
        run = self.new_run(prompts, s, ticket.time_left_s)
        self.active += 1
        entry: LedgerEntry | None = None
        try:
            await run.start()
            entry = self.ledger.open()
            out = await run.wait(request.is_disconnected)
            entry.end("answered")
            return out
        except ClientGone:
            log.info("client disconnected: %d choice(s) cancelled in the engine", len(run.choices))
            if entry is not None:
                entry.end("aborted")
            raise
        finally:
            if entry is not None:
                entry.end_once("failed")
            self.active -= 1
            ticket.release()

    async def legacy(self, prompts: list[str], s: Sampling, cost: int) -> list[ChoiceResult]:
        """A TextGenerator without submit(): text in, text out, holding ``cost`` tokens and the gate for the
        whole call."""
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
        ticket = await self.hold_tokens(cost)
        try:
            async with self.gate.admit_async(ticket.time_left_s):
                outs = await self._generate_text(expanded, s)
        finally:
            ticket.release()
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

    async def _generate_text(self, expanded: list[str], s: Sampling) -> Any:
        if self.use_async and self.agenerate is not None:
            return await self.agenerate(expanded, max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed)
        gen = self.generator
        return await anyio.to_thread.run_sync(
            lambda: gen.generate(expanded, max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed)
        )


class Ticket:
    """Tokens held in a :class:`TokenBudget` by one request; :meth:`release` gives them back once."""

    def __init__(self, budget: TokenBudget, cost: int, time_left_s: float) -> None:
        self.budget = budget
        self.cost = cost
        self.time_left_s = time_left_s
        self._held = True

    def release(self) -> None:
        """Give the tokens back (a no-op the second time)."""
        if self._held:
            self._held = False
            self.budget.release(self.cost)


def max_top_logprobs(engine: Any) -> int:
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


__all__ = ["ChatTemplate", "ServerContext", "Ticket", "max_top_logprobs"]
