"""Every error the server answers, in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``:
the exception each refusal raises, mapped once to its status code (and ``Retry-After`` where a retry helps)."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from colo_fsm.errors import ClientGone, ConfigError, EngineStopped, ServerBusy, ServerStopping, ServerUnavailable
from colo_fsm.log import get_logger
from colo_fsm.server.context import ServerContext
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


def install_error_handlers(app: FastAPI, ctx: ServerContext) -> None:
    """Map every refusal (and any crash) of ``app``'s routes to its OpenAI-shaped response."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            msg = f"no route {request.method} {short(request.url.path, 80)}"
            return error_response(404, msg, "invalid_request_error", code="not_found")
        if exc.status_code == 405:
            msg = f"method {request.method} not allowed on {short(request.url.path, 80)}"
            return error_response(405, msg, "invalid_request_error", code="method_not_allowed", headers=exc.headers)
        return error_response(exc.status_code, short(str(exc.detail), 200), "invalid_request_error")

    @app.exception_handler(BadRequest)
    async def _bad(_request: Request, exc: BadRequest) -> JSONResponse:
        ctx.served["bad_request"] += 1
        return error_response(exc.status, str(exc), "invalid_request_error", param=exc.param)

    @app.exception_handler(ServerUnavailable)
    async def _unavailable(_request: Request, exc: ServerUnavailable) -> JSONResponse:
        ctx.served["unavailable"] += 1
        if ctx.stopping():
            return shutting_down()
        headers = {"Retry-After": str(ctx.retry_after_s)}
        return error_response(503, str(exc), "service_unavailable", code="engine_suspended", headers=headers)

    @app.exception_handler(ServerBusy)
    async def _busy(_request: Request, exc: ServerBusy) -> JSONResponse:
        ctx.served["busy"] += 1
        headers = {"Retry-After": str(ctx.retry_after_s)}
        return error_response(429, str(exc), "rate_limit_error", param=None, code=exc.bound, headers=headers)

    @app.exception_handler(EngineStopped)
    @app.exception_handler(ServerStopping)
    async def _stopping_handler(_request: Request, _exc: Exception) -> JSONResponse:
        ctx.served["unavailable"] += 1
        return shutting_down()

    @app.exception_handler(ClientGone)
    async def _gone(_request: Request, _exc: ClientGone) -> JSONResponse:
        return error_response(499, "client closed the request; it was cancelled in the engine", "client_closed_request")

    @app.exception_handler(ConfigError)
    async def _config(_request: Request, exc: ConfigError) -> JSONResponse:
        ctx.served["bad_request"] += 1
        msg = f"{exc.field}={short(exc.value)}: expected {short(exc.expected, 200)}"
        return error_response(400, msg, "invalid_request_error", param=exc.field)

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception) -> JSONResponse:
        ctx.served["errors"] += 1
        log.exception("request failed")
        return error_response(500, f"internal error: {type(exc).__name__}: {short(str(exc), 200)}", "server_error")


__all__ = ["error_response", "install_error_handlers", "shutting_down"]
