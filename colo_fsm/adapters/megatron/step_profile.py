"""Where the dynamic engine's decode steps go: counted per kind of step, cheaply, on every step.

megatron-core's dynamic engine runs one of four kinds of step: decode-only or mixed (prefill of newly admitted
requests beside the decode of the others), each on a pre-captured CUDA graph or eagerly. How many steps of each
kind a window holds, how long they took and how many requests each decoded is what tells a decode rate that
falls short of the pure graph decode apart: too many mixed or eager steps, too few requests per step, or
requests megatron paused or kept waiting. :class:`StepProfile` keeps those sums (a few integers and floats per
step); :func:`record_dynamic_step` reads them off the engine after each ``step_modern()``.
"""

from __future__ import annotations

import threading
from typing import Any

KINDS = ("decode_graph", "decode_eager", "mixed_graph", "mixed_eager", "unknown")
"""Kinds of step: decode-only or mixed, on a CUDA graph or eager ("unknown": megatron did not say)."""


class StepProfile:
    """Sums per kind of step (steps, wall seconds, requests active after it), and of requests paused and waiting.

    Written by the engine thread after each step, read by any thread (:meth:`snapshot`); :func:`window` gives the
    difference of two snapshots, e.g. over a benchmark's measured steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, float] = {}

    def add(self, kind: str, wall_s: float, active: int, paused: int, waiting: int) -> None:
        """One step of ``kind`` (see :data:`KINDS`) that took ``wall_s``; after it, ``active`` requests in
        megatron's context unpaused (what the next step decodes), ``paused`` paused by megatron (KV blocks short)
        and ``waiting`` in its own queue."""
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: one of {KINDS}")
        with self._lock:
            s = self._sums
            for key, v in (
                (f"{kind}/steps", 1),
                (f"{kind}/wall_s", wall_s),
                (f"{kind}/active", active),
                ("paused", paused),
                ("waiting", waiting),
                ("steps", 1),
            ):
                s[key] = s.get(key, 0) + v

    def snapshot(self) -> dict[str, float]:
        """The sums so far."""
        with self._lock:
            return dict(self._sums)


def window(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What happened between two snapshots: per kind its steps, share of steps, mean ms per step and mean requests
    active after it; overall the mean requests paused and waiting per step."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    steps = d.get("steps", 0)
    out: dict[str, Any] = {"steps": int(steps)}
    for kind in KINDS:
        n = d.get(f"{kind}/steps", 0)
        if not n:
            continue
        out[kind] = {
            "steps": int(n),
            "share": n / steps,
            "ms_per_step": 1e3 * d.get(f"{kind}/wall_s", 0.0) / n,
            "mean_active": d.get(f"{kind}/active", 0) / n,
        }
    if steps:
        out["mean_paused"] = d.get("paused", 0) / steps
        out["mean_waiting"] = d.get("waiting", 0) / steps
    return out


def _decode_only(engine: Any) -> bool | None:
    """Whether the forward whose output the last step consumed was decode-only, None where megatron does not say.

    megatron-core 0.19.2 keeps ``engine.decode_only`` as a ``DecodeOnly(consumed, launched)`` pair whose ``bool()``
    raises when the two differ (its asynchronous schedule launches the next forward before consuming this one);
    the step's time and ``cuda_graph_request_count`` belong to the consumed forward, so that is the one read. An
    older engine's plain bool is taken as it is."""
    state = getattr(engine, "decode_only", None)
    if state is None or isinstance(state, bool):
        return state
    consumed = getattr(state, "consumed", None)
    return consumed if isinstance(consumed, bool) else None


def record_dynamic_step(profile: StepProfile, engine: Any, result: Any, wall_s: float) -> None:
    """Add one ``step_modern()`` of megatron-core's ``DynamicInferenceEngine`` to ``profile``: decode-only or mixed
    from ``engine.decode_only`` (:func:`_decode_only`), graph or eager from the result's
    ``cuda_graph_request_count``, and the context's request counts after the step (megatron-core 0.19.2 names; a
    field it lacks makes the kind "unknown" or the count 0, never an error in the step)."""
    decode_only = _decode_only(engine)
    graph = result.get("cuda_graph_request_count") if isinstance(result, dict) else None
    if decode_only is None or not isinstance(result, dict) or "cuda_graph_request_count" not in result:
        kind = "unknown"
    else:
        kind = f"{'decode' if decode_only else 'mixed'}_{'graph' if graph is not None else 'eager'}"
    ctx = getattr(engine, "context", None)
    total = int(getattr(ctx, "total_request_count", 0) or 0)
    paused = int(getattr(ctx, "paused_request_count", 0) or 0)
    waiting = len(getattr(engine, "waiting_request_ids", ()) or ())
    profile.add(kind, wall_s, total - paused, paused, waiting)


__all__ = ["KINDS", "StepProfile", "record_dynamic_step", "window"]
