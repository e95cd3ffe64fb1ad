"""The OpenAI-compatible HTTP front over the colocated engine.

Endpoints: ``POST /v1/completions``, ``/v1/chat/completions`` (both with SSE streaming), ``/v1/responses``
(text in, text out), ``POST /tokenize`` and ``/detokenize`` (also under ``/v1``), ``GET /v1/models``,
``/v1/models/{id}``, ``/health`` and ``/metrics`` (Prometheus). Requests take their cost in tokens of a fair
budget (:mod:`~colo_fsm.server.budget`; 429 with a computed ``Retry-After`` when it stays full) and are handed
to the engine only through the :class:`~colo_fsm.server.gate.SuspendGate`: while the engine is suspended they
wait (up to ``request_timeout_s``, then 503 with ``Retry-After`` from the measured handoff length); after
teardown they get a 503 without it. A client that goes away at any stage is a client outcome, never a server
error (:mod:`~colo_fsm.server.client`, :mod:`~colo_fsm.server.outcomes`). Every error,
404 and 405 included, uses OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` and names the
field; nothing the server does not implement is ignored silently (400 naming it).

Over an engine with the request-level ``submit()`` every feature is available (token-id prompts, per-token
log-probs, stop strings, streaming). Over a plain :class:`~colo_fsm.adapters.protocols.TextGenerator` only
text prompts without those features are served; the others get a 400 naming the parameter.

The parts: :mod:`~colo_fsm.server.context` (what the routes share, the steps of a request),
:mod:`~colo_fsm.server.routes` (the endpoints), :mod:`~colo_fsm.server.streaming` (SSE),
:mod:`~colo_fsm.server.http_errors` (errors in OpenAI's shape), :mod:`~colo_fsm.server.health`,
:mod:`~colo_fsm.server.metrics` and :mod:`~colo_fsm.server.observe` (``/metrics``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from colo_fsm.adapters.protocols import TextGenerator
from colo_fsm.errors import ConfigError
from colo_fsm.server.context import ChatTemplate, ServerContext
from colo_fsm.server.gate import SuspendGate
from colo_fsm.server.health import add_health
from colo_fsm.server.http_errors import install_error_handlers
from colo_fsm.server.lifecycle_clock import LifecycleClock
from colo_fsm.server.observe import add_metrics
from colo_fsm.server.outcomes import OutcomeMiddleware
from colo_fsm.server.params import MAX_N, BadRequest
from colo_fsm.server.routes import add_routes
from colo_fsm.server.settings import DEFAULT_MAX_REQUEST_TOKENS, ServerSettings
from colo_fsm.server.templates import role_lines_template

default_chat_template: ChatTemplate = role_lines_template
"""``"<role>: <content>"`` lines followed by ``"assistant:"``; pass your tokenizer's template instead."""


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
    rank: int = 0,
    lifecycle: LifecycleClock | None = None,
) -> FastAPI:
    """Build the FastAPI app (no socket yet); :class:`~colo_fsm.server.server.OpenAIServer` runs it.

    ``generator`` is an engine with ``submit()`` (every feature) or a ``TextGenerator``; ``tokenizer``
    (default: ``generator.tokenizer``) encodes prompts and chat templates. ``status`` (e.g.
    ``lifecycle.status``) feeds ``/health``; ``stopping()`` says a teardown began. Any model name is accepted
    and echoed back; ``/v1/models`` lists ``model_name``. ``rank`` labels the ``/metrics`` series;
    ``lifecycle`` (a :class:`~colo_fsm.server.lifecycle_clock.LifecycleClock` subscribed to the lifecycle's
    trace) feeds its lifecycle series. ``retry_after_s`` is the smallest ``Retry-After`` sent, and the one sent
    before anything was measured.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError("rank", rank, "a non-negative integer (the serving rank, a label of /metrics)")
    if not callable(getattr(generator, "generate", None)) and not callable(getattr(generator, "submit", None)):
        raise ConfigError("generator", generator, "an engine with submit() or a TextGenerator (with generate())")
    if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, int | float) or request_timeout_s < 0:
        raise ConfigError("request_timeout_s", request_timeout_s, "a non-negative number of seconds")
    if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int) or retry_after_s < 1:
        raise ConfigError("retry_after_s", retry_after_s, "a positive whole number of seconds")
    ctx = ServerContext(
        generator,
        gate=gate if gate is not None else SuspendGate(name="server", is_open=True),
        model_name=model_name,
        request_timeout_s=request_timeout_s,
        retry_after_s=retry_after_s,
        status=status,
        chat_template=chat_template,
        count_tokens=count_tokens,
        tokenizer=tokenizer,
        settings=settings or ServerSettings(),
        stopping=stopping,
        rank=rank,
        lifecycle=lifecycle,
    )
    app = FastAPI(title="colo-fsm OpenAI-compatible server", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(OutcomeMiddleware, outcomes=ctx.outcomes)
    install_error_handlers(app, ctx)
    add_routes(app, ctx)
    add_health(app, ctx)
    add_metrics(app, ctx)
    app.state.ctx = ctx
    app.state.gate = ctx.gate
    app.state.settings = ctx.cfg
    return app


__all__ = [
    "DEFAULT_MAX_REQUEST_TOKENS",
    "MAX_N",
    "BadRequest",
    "ChatTemplate",
    "ServerSettings",
    "create_app",
    "default_chat_template",
]
