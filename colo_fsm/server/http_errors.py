"""Every error the server answers, in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``:
the exception each refusal raises, mapped once to its status code (and a computed ``Retry-After`` where a retry
helps: from the budget's drain rate for a 429, from the measured handoff length for a 503), and the outcome it
records."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from colo_fsm.errors import (
    ClientGone,
    ConfigError,
    EngineStopped,
    PayloadTooLarge,
    ServerBusy,
    ServerStopping,
    ServerUnavailable,
    UploadTimeout,
)
from colo_fsm.log import get_logger
from colo_fsm.server.client import Stage
from colo_fsm.server.context import ServerContext
from colo_fsm.server.outcomes import Outcome, tag_of
from colo_fsm.server.params import BadRequest, short

log = get_logger(__name__)


def error_response(
    status: int,
    message: str,
    err_type: str,
    param: str | None = None,
    code: str | int | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A JSON error response in OpenAI's shape."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def shutting_down() -> JSONResponse:
    """503 without ``Retry-After``: the server is going away."""
    return error_response(503, "the server is shutting down; do not retry", "service_unavailable", code="shutting_down")


def _tag(request: Request, outcome: Outcome, stage: Stage | None = None) -> None:
    tag = tag_of(request)
    if tag is not None:
        tag.set(outcome, stage)


def install_error_handlers(app: FastAPI, ctx: ServerContext) -> None:
    """Map every refusal (and any crash) of ``app``'s routes to its OpenAI-shaped response, and record how the
    request ended (:class:`~colo_fsm.server.outcomes.Outcome`)."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        _tag(request, Outcome.BAD_REQUEST)
        if exc.status_code == 404:
            msg = f"no route {request.method} {short(request.url.path, 80)}"
            return error_response(404, msg, "invalid_request_error", code="not_found")
        if exc.status_code == 405:
            msg = f"method {request.method} not allowed on {short(request.url.path, 80)}"
            return error_response(405, msg, "invalid_request_error", code="method_not_allowed", headers=exc.headers)
        return error_response(exc.status_code, short(str(exc.detail), 200), "invalid_request_error")

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest) -> JSONResponse:
        timed_out = isinstance(exc, UploadTimeout)
        _tag(request, Outcome.UPLOAD_TIMEOUT if timed_out else Outcome.BAD_REQUEST, Stage.UPLOAD if timed_out else None)
        if timed_out:
            log.debug("upload timed out: %s (%s)", exc, ctx.where())
        # a body not read whole leaves the connection unusable for another request: close it
        headers = {"Connection": "close"} if isinstance(exc, UploadTimeout | PayloadTooLarge) else None
        code = "upload_timeout" if timed_out else None
        return error_response(
            exc.status, str(exc), "invalid_request_error", param=exc.param, code=code, headers=headers
        )

    @app.exception_handler(ServerUnavailable)
    async def _unavailable(request: Request, exc: ServerUnavailable) -> JSONResponse:
        if ctx.stopping():
            _tag(request, Outcome.SHUTTING_DOWN)
            return shutting_down()
        _tag(request, Outcome.SUSPENDED)
        retry = ctx.gate.handoffs.retry_after(ctx.retry_after_s, ctx.cfg.max_retry_after_s)
        ctx.metrics.retry_after_given(503, retry)
        msg = f"{exc}; handoffs here last {_handoff_words(ctx)}"
        headers = {"Retry-After": str(retry)}
        return error_response(503, msg, "service_unavailable", code="engine_suspended", headers=headers)

    @app.exception_handler(ServerBusy)
    async def _busy(request: Request, exc: ServerBusy) -> JSONResponse:
        _tag(request, Outcome.BUSY)
        retry = exc.retry_after_s if exc.retry_after_s is not None else ctx.retry_after_s
        ctx.metrics.retry_after_given(429, retry)
        rate = ctx.budget.drain.per_second()
        msg = f"{exc}; the budget drains about {rate:.0f} tokens/s here, so retry in about {retry} s"
        headers = {"Retry-After": str(retry)}
        return error_response(429, msg, "rate_limit_error", param=None, code=exc.bound, headers=headers)

    @app.exception_handler(EngineStopped)
    @app.exception_handler(ServerStopping)
    async def _stopping_handler(request: Request, _exc: Exception) -> JSONResponse:
        _tag(request, Outcome.SHUTTING_DOWN)
        return shutting_down()

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> JSONResponse:
        _tag(request, Outcome.CLIENT_GONE, Stage(exc.stage) if exc.stage in set(Stage) else None)
        log.debug("client gone during %s (%s)", exc.stage, ctx.where())
        return error_response(499, "client closed the request; it was cancelled in the engine", "client_closed_request")

    @app.exception_handler(ConfigError)
    async def _config(request: Request, exc: ConfigError) -> JSONResponse:
        _tag(request, Outcome.BAD_REQUEST)
        msg = f"{exc.field}={short(exc.value)}: expected {short(exc.expected, 200)}"
        return error_response(400, msg, "invalid_request_error", param=exc.field)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        _tag(request, Outcome.ERROR)
        log.exception("request failed (%s)", ctx.where())
        return error_response(500, f"internal error: {type(exc).__name__}: {short(str(exc), 200)}", "server_error")


def _handoff_words(ctx: ServerContext) -> str:
    recent = ctx.gate.handoffs.recent()
    if not recent:
        return "an unknown time (none measured yet)"
    recent.sort()
    return f"{recent[len(recent) // 2]:.1f} s at the median of the last {len(recent)}"


__all__ = ["error_response", "install_error_handlers", "shutting_down"]
