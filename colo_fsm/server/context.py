"""What every route of one server shares: the engine, tokenizer, gate, settings, counters and metrics, and the steps
of a request (read the body, encode the prompt, check it fits, take its tokens of the budget, run it on the engine
behind the gate), each counted in its :class:`~colo_fsm.server.client.Stage` and watched for a client that goes
away."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio.to_thread
from starlette.requests import Request

from colo_fsm.adapters.protocols import Completion, TextGenerator
from colo_fsm.errors import ConfigError, ServerBusy
from colo_fsm.log import get_logger
from colo_fsm.server.admission import check_request_size
from colo_fsm.server.body import read_json
from colo_fsm.server.budget import TokenBudget
from colo_fsm.server.client import ClientWatch, Stage, StageCounts
from colo_fsm.server.gate import SuspendGate
from colo_fsm.server.ledger import LedgerEntry, RequestLedger
from colo_fsm.server.lifecycle_clock import LifecycleClock
from colo_fsm.server.metrics import ServerMetrics
from colo_fsm.server.outcomes import Outcomes
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
    """One server's engine (``submit()``, or a plain ``TextGenerator``), tokenizer, gate, settings, counters and
    metrics. ``rank`` labels its metrics and logs; ``lifecycle`` (a trace subscriber) feeds the lifecycle's
    series."""

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
        rank: int = 0,
        lifecycle: LifecycleClock | None = None,
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
        self.rank = int(rank)
        self.lifecycle = lifecycle
        self.metrics = ServerMetrics(self.rank)
        self.outcomes = Outcomes(self.metrics.request_ended)
        self.stages = StageCounts()
        self.max_request_tokens, self.max_inflight_tokens = settings.token_limits(self.engine)
        self.budget = TokenBudget(
            self.max_inflight_tokens,
            settings.max_waiting_requests,
            fair_window_s=settings.fair_window_s,
            retry_after_s=retry_after_s,
            max_retry_after_s=settings.max_retry_after_s,
        )
        self.ledger = RequestLedger()
        self.active = 0  # requests handed to the engine and not answered yet (shutdown waits for them)
        self.step_profile_read_errors = 0  # scrapes that could not read the engine's step profile (observe.py)
        gate.on_handoff(self.metrics.handoff_ended)

    # ------------------------------------------------------------------ state
    def stopping(self) -> bool:
        """Whether a teardown began (the gate retired or the ``stopping`` source says so)."""
        return self.gate.retired or bool(self.stopping_source and self.stopping_source())

    def where(self) -> str:
        """``rank R, state S, weight version V`` for log lines (read without waiting on anything)."""
        version = None
        if self.lifecycle is not None:
            version = self.lifecycle.read().weight_version
        return f"rank {self.rank}, state {self.gate.state()}, weight version {version}"

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

    async def hold_tokens(self, cost: int, watch: ClientWatch | None = None) -> Ticket:
        """Take ``cost`` tokens of the server's :class:`~colo_fsm.server.budget.TokenBudget` (waiting up to
        ``request_timeout_s``; :class:`ClientGone` at stage ``queue`` if ``watch`` sees the client leave first).

        A wait that ends is a 429 with ``Retry-After`` from the budget's drain rate, whatever the engine is doing
        (a wait at a suspended engine's gate is the 503); while the server stops, a 503 "shutting down"."""
        t0 = time.monotonic()
        with self.stages.inside(Stage.QUEUE):
            acquire = self.budget.acquire(cost, self.request_timeout_s)
            try:
                await (watch.race(acquire, Stage.QUEUE) if watch is not None else acquire)
            except ServerBusy:
                if self.stopping():
                    raise ServerStopping("shutting down") from None
                raise
        return Ticket(self.budget, cost, max(0.0, self.request_timeout_s - (time.monotonic() - t0)), t0)

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
        """The request body as a JSON object being read (415, 413, 408 and 400 as :mod:`~colo_fsm.server.body`
        says; :class:`ClientGone` at stage ``upload`` when the client leaves)."""
        with self.stages.inside(Stage.UPLOAD):
            return Body(await read_json(request, self.cfg.max_body_bytes, self.cfg.upload_timeout_s))

    async def hand_over(self, run: RequestRun, watch: ClientWatch, ticket: Ticket, *, events: bool = False) -> Any:
        """Wait for the gate and hand ``run`` to the engine, in stage ``queue`` (:class:`ClientGone` if the client
        leaves first); with ``events`` it returns the run's event stream (``run.events()``). The queue wait, from
        the body read to the hand-over, is observed."""
        with self.stages.inside(Stage.QUEUE):
            out = await watch.race(run.events() if events else run.start(), Stage.QUEUE)
        self.metrics.queue_waited(time.monotonic() - ticket.since)
        return out

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
        """Run a non-streamed request to the end, holding ``cost`` tokens of the budget until the engine is done
        with it; a client that goes away (queued or in the engine) has it cancelled there (:class:`ClientGone`)."""
        if self.stopping():
            raise ServerStopping("shutting down")
        watch = ClientWatch(request.receive).start()
        try:
            ticket = await self.hold_tokens(cost, watch)
            try:
                return await self._run_holding(prompts, s, watch, ticket)
            finally:
                ticket.release()
        finally:
            await watch.stop()

    async def _run_holding(
        self, prompts: list[list[int]], s: Sampling, watch: ClientWatch, ticket: Ticket
    ) -> list[ChoiceResult]:
        run = self.new_run(prompts, s, ticket.time_left_s)
        self.active += 1
        entry: LedgerEntry | None = None
        try:
            await self.hand_over(run, watch, ticket)
            entry = self.ledger.open()
            with self.stages.inside(Stage.GENERATION):
                out = await run.wait(watch.gone)
            entry.end("answered")
            return out
        except ClientGone:
            log.debug("client gone: %d choice(s) cancelled in the engine (%s)", len(run.choices), self.where())
            if entry is not None:
                entry.end("aborted")
            raise
        finally:
            if entry is not None:
                entry.end_once("failed")
            self.active -= 1

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
            with self.stages.inside(Stage.GENERATION):
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
            return await self.agenerate(
                expanded, max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed_for(0)
            )
        gen = self.generator
        return await anyio.to_thread.run_sync(
            lambda: gen.generate(expanded, max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed_for(0))
        )


class Ticket:
    """Tokens held in a :class:`TokenBudget` by one request; :meth:`release` gives them back once. ``since``: when
    the request began to wait for them (``time.monotonic()``)."""

    def __init__(self, budget: TokenBudget, cost: int, time_left_s: float, since: float) -> None:
        self.budget = budget
        self.cost = cost
        self.time_left_s = time_left_s
        self.since = since
        self._held = True

    @property
    def held(self) -> bool:
        """Whether the tokens are still held."""
        return self._held

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
