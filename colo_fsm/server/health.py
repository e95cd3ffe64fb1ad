"""``GET /health``: the server's state, from what the server itself holds (the gate, its own counters, the
lifecycle's lock-free status, the engine's lock-free request counts): it never waits on a lock the engine loop
takes.

The status code is what a load balancer or a liveness probe reads:

======================  ========  =================================================================
``status``              code      meaning
======================  ========  =================================================================
``ok``                  200       serving: requests are admitted now
``handoff``             200       a handoff (training, a checkpoint): requests wait, parked ones live
``stopping``            503       a teardown began: new requests get 503 "shutting down"
``stopped``             503       the engine is torn down
``failed``              503       the lifecycle failed (its ``failure`` is in the body)
======================  ========  =================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from colo_fsm.server.context import ServerContext
from colo_fsm.server.formatting import jsonable
from colo_fsm.server.observe import engine_health
from colo_fsm.server.params import short

HEALTH_CODES: dict[str, int] = {"ok": 200, "handoff": 200, "stopping": 503, "stopped": 503, "failed": 503}
"""The status code of ``/health`` per server status."""


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
        status = {"open": "ok", "closed": "handoff"}.get(state, state)
        info: dict[str, Any] = {
            "admission": state,
            "gate": ctx.gate.state(),
            **ctx.gate.counters(),
            "http_requests_active": ctx.active,
            "stages": ctx.stages.now(),
            "requests": ctx.ledger.counters(),
            "engine_requests": engine_health(ctx),
            "tokens": ctx.budget.counters(),
            "max_request_tokens": ctx.max_request_tokens,
            "responses": ctx.outcomes.counts(),
            "handoffs": {
                "count": ctx.gate.handoffs.count,
                "recent_s": [round(x, 3) for x in ctx.gate.handoffs.recent()],
            },
            "inflight_policy": ctx.cfg.inflight_policy,
            "logprobs_mode": ctx.logprobs_mode,
        }
        if ctx.status is not None:
            try:
                st = jsonable(ctx.status())
            except Exception as exc:  # health must answer even if the status source is broken
                st = {"error": f"{type(exc).__name__}: {short(str(exc), 200)}"}
            info["lifecycle"] = st
            if isinstance(st, Mapping):
                info["lifecycle_state"] = st.get("state")
                info["weight_version"] = st.get("weight_version")
                if st.get("failure"):
                    status = "failed"
        return JSONResponse({"status": status, **info}, status_code=HEALTH_CODES[status])


__all__ = ["HEALTH_CODES", "add_health", "admission"]
