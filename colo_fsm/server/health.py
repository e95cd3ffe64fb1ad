"""``GET /health``: the server's admission state and counters, answered from what the server holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from colo_fsm.server.context import ServerContext
from colo_fsm.server.formatting import jsonable
from colo_fsm.server.params import short


def admission(ctx: ServerContext) -> str:
    """``"open"``, ``"closed"`` (a handoff), ``"stopping"`` or ``"stopped"``."""
    phase = getattr(ctx.stopping_source, "phase", None)  # GatedEngine's: "running", "stopping", "stopped"
    if phase is not None and phase() in ("stopping", "stopped"):
        return str(phase())
    if ctx.gate.retired:
        return "stopped"
    if ctx.stopping():
        return "stopping"
    return "open" if ctx.gate.admissible() else "closed"


def add_health(app: FastAPI, ctx: ServerContext) -> None:
    """Register ``GET /health`` on ``app``."""

    @app.get("/health", response_model=None)
    async def health() -> Any:
        state = admission(ctx)
        info: dict[str, Any] = {
            "status": {"open": "ok", "closed": "handoff"}.get(state, state),
            "admission": state,
            "gate": ctx.gate.state(),
            **ctx.gate.counters(),
            "responses": dict(ctx.served),
            "inflight_policy": ctx.cfg.inflight,
        }
        engine = ctx.engine
        if engine is not None and callable(getattr(engine, "request_counts", None)):
            try:
                info["engine_requests"] = jsonable(engine.request_counts())
            except Exception as exc:  # health must answer even if the engine is torn down
                info["engine_requests"] = {"error": type(exc).__name__}
        if ctx.status is not None:
            try:
                st = jsonable(ctx.status())
            except Exception as exc:  # health must answer even if the status source is broken
                st = {"error": f"{type(exc).__name__}: {short(str(exc), 200)}"}
            info["lifecycle"] = st
            if isinstance(st, Mapping):
                info["lifecycle_state"] = st.get("state")
                info["weight_version"] = st.get("weight_version")
        code = 503 if state in ("stopping", "stopped") else 200
        return JSONResponse(info, status_code=code)


__all__ = ["add_health", "admission"]
