"""What ``/health`` and ``/metrics`` read from one server, never waiting on the engine: the engine's request counts
(through its lock-free ``request_counts_nowait``), the budget, the stages, the lifecycle; and ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from starlette.responses import Response

from colo_fsm.adapters.engine.options import Priority
from colo_fsm.log import get_logger
from colo_fsm.server.context import ServerContext
from colo_fsm.server.formatting import jsonable
from colo_fsm.server.metrics import ServerReading

log = get_logger(__name__)


def engine_counts(engine: Any) -> dict[str, tuple[int, int, int]] | None:
    """``{"training": (queued, running, parked), "server": (...)}`` from ``engine.request_counts_nowait(priority)``
    (read without the engine's lock); None when the engine has no such method."""
    read = getattr(engine, "request_counts_nowait", None)
    if not callable(read):
        return None
    return {p.name.lower(): tuple(int(x) for x in read(p)) for p in (Priority.TRAINING, Priority.SERVER)}  # type: ignore[misc]


def server_slots(engine: Any) -> int | None:
    """The engine slots HTTP requests may hold at once (its ``server_slots``), None when it does not say."""
    slots = getattr(engine, "server_slots", None)
    return int(slots) if isinstance(slots, int) and not isinstance(slots, bool) else None


def engine_step_totals(ctx: ServerContext) -> dict[str, Any] | None:
    """The engine's step-profile totals (:func:`~colo_fsm.adapters.megatron.step_profile.totals`) from its
    ``step_profile()`` snapshot (its own small lock, never the engine's); None where it keeps no profile, or where
    reading it failed: counted in ``ctx.step_profile_read_errors`` (on ``/metrics``), logged with its traceback the
    first time."""
    read = getattr(ctx.engine, "step_profile", None)
    if not callable(read):
        return None
    from colo_fsm.adapters.megatron.step_profile import totals

    try:
        snapshot = read()
        return totals(snapshot) if isinstance(snapshot, dict) else None
    except Exception:  # a scrape answers with every other series: leave these out, and count it
        ctx.step_profile_read_errors += 1
        if ctx.step_profile_read_errors == 1:
            log.warning(
                "%s: /metrics could not read the engine's step profile (its series left out; counted in "
                "colo_fsm_engine_step_profile_read_errors_total)",
                ctx.where(),
                exc_info=True,
            )
        return None


def step_profile_read_errors(ctx: ServerContext) -> int | None:
    """Scrapes that could not read the engine's step profile so far; None where the engine has no
    ``step_profile()`` (the count is read and written only by scrapes, which run on the server's event loop)."""
    return ctx.step_profile_read_errors if callable(getattr(ctx.engine, "step_profile", None)) else None


def status_of(ctx: ServerContext) -> Mapping[str, Any]:
    """The lifecycle's status as a mapping (empty without a status source)."""
    if ctx.status is None:
        return {}
    st = jsonable(ctx.status())
    return st if isinstance(st, Mapping) else {}


def server_reading(ctx: ServerContext) -> ServerReading:
    """Everything ``/metrics`` reads at a scrape."""
    b = ctx.budget
    lc = ctx.lifecycle.read() if ctx.lifecycle is not None else None
    st = status_of(ctx) if lc is None or not lc.records else {}
    return ServerReading(
        tokens_held=b.held,
        tokens_limit=b.limit,
        tokens_waiting=b.waiting_tokens,
        requests_waiting=b.waiting,
        requests_holding=b.holders,
        tokens_admitted=b.admitted_tokens,
        requests_admitted=b.admitted_requests,
        drain_tokens_per_s=b.drain.per_second(),
        stages=ctx.stages.now(),
        admitting=ctx.gate.admissible() and not ctx.stopping(),
        engine=engine_counts(ctx.engine),
        server_slots=server_slots(ctx.engine),
        engine_steps=engine_step_totals(ctx),
        engine_step_read_errors=step_profile_read_errors(ctx),
        lifecycle=lc,
        state=st.get("state"),
        weight_version=st.get("weight_version"),
    )


def engine_health(ctx: ServerContext) -> dict[str, Any] | None:
    """The engine's slot counts for ``/health``: queued, running and parked requests per priority, and the slots
    HTTP requests may hold."""
    counts = engine_counts(ctx.engine)
    if counts is None:
        return None
    out: dict[str, Any] = {
        name: dict(zip(("queued", "running", "parked"), c, strict=True)) for name, c in counts.items()
    }
    out["server_slots"] = server_slots(ctx.engine)
    return out


def add_metrics(app: FastAPI, ctx: ServerContext) -> None:
    """Register ``GET /metrics`` (Prometheus text exposition of this server's registry) on ``app``."""
    ctx.metrics.watch(lambda: server_reading(ctx))

    @app.get("/metrics", response_model=None)
    async def metrics() -> Response:
        body, content_type = ctx.metrics.exposition()
        return Response(body, media_type=content_type)


__all__ = [
    "add_metrics",
    "engine_counts",
    "engine_health",
    "engine_step_totals",
    "server_reading",
    "server_slots",
    "status_of",
    "step_profile_read_errors",
]
