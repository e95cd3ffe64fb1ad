"""Where the dynamic engine's decode steps go: counted per kind of step, cheaply, on every step.

megatron-core's dynamic engine runs one of four kinds of step: decode-only or mixed (prefill of newly admitted
requests beside the decode of the others), each on a pre-captured CUDA graph or eagerly. How many steps of each
kind a window holds, how long they took and how many requests each decoded is what tells a decode rate that
falls short of the pure graph decode apart: too many mixed or eager steps, too few requests per step, or
requests megatron paused or kept waiting. A decode-only graph step is also counted under the captured graph it
ran (its batch size: a step of 65 requests runs the 128 graph when megatron captured the powers of two), with the
requests it decoded, so what padding costs can be read off a run. :class:`StepProfile` keeps those sums (a few integers
and floats per step); :func:`record_dynamic_step` reads them off the engine after each step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from colo_fsm.log import get_logger

log = get_logger(__name__)

KINDS = ("decode_graph", "decode_eager", "mixed_graph", "mixed_eager", "unknown")
"""Kinds of step: decode-only or mixed, on a CUDA graph or eager ("unknown": megatron did not say)."""


class StepProfile:
    """Sums per kind of step (steps, wall seconds, requests active after it), and of requests paused and waiting.

    Written by the engine thread after each step, read by any thread (:meth:`snapshot`); :func:`window` gives the
    difference of two snapshots, e.g. over a benchmark's measured steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, float] = {}

    def add(
        self,
        kind: str,
        wall_s: float,
        active: int,
        paused: int,
        waiting: int,
        *,
        ran: int | None = None,
        graph: int | None = None,
    ) -> None:
        """One step of ``kind`` (see :data:`KINDS`) that took ``wall_s``; after it, ``active`` requests in
        megatron's context unpaused (what the next step decodes), ``paused`` paused by megatron (KV blocks short)
        and ``waiting`` in its own queue. ``ran`` is the requests the step decoded (None: megatron did not say);
        ``graph`` the batch size of the captured graph a ``decode_graph`` step ran on (None: not said; megatron's
        graphs for mixed steps share request counts across token counts, so those are never split)."""
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: one of {KINDS}")
        if graph is not None and (isinstance(graph, bool) or not isinstance(graph, int) or graph < 1):
            raise ValueError(f"graph {graph!r}: a captured graph's batch size (a positive integer), or None")
        if graph is not None and kind != "decode_graph":
            raise ValueError(f"graph {graph!r} with kind {kind!r}: only decode_graph steps are split by graph")
        parts: list[tuple[str, float]] = [
            (f"{kind}/steps", 1),
            (f"{kind}/wall_s", wall_s),
            (f"{kind}/active", active),
            ("paused", paused),
            ("waiting", waiting),
            ("steps", 1),
        ]
        if ran is not None:
            parts += [(f"{kind}/ran", ran), (f"{kind}/ran_steps", 1)]
        if graph is not None:
            at = f"{kind}/graph/{graph}"
            parts += [(f"{at}/steps", 1), (f"{at}/wall_s", wall_s)]
            if ran is not None:
                parts += [(f"{at}/ran", ran), (f"{at}/ran_steps", 1)]
        with self._lock:
            s = self._sums
            for key, v in parts:
                s[key] = s.get(key, 0) + v

    def add_dummy_forward(self) -> None:
        """Count one dummy forward: megatron's coordinator loop runs one where it has no request of its own while
        its last consensus said some expert-parallel peer has work (a peer decoding, or its own work of up to
        ``ep_consensus_interval`` iterations ago); megatron counts it as a step, but it decodes no request."""
        with self._lock:
            self._sums["dummy_forwards"] = self._sums.get("dummy_forwards", 0) + 1

    def record_error(self) -> int:
        """Count a step that could not be recorded; returns how many so far."""
        with self._lock:
            self._sums["record_errors"] = self._sums.get("record_errors", 0) + 1
            return int(self._sums["record_errors"])

    def snapshot(self) -> dict[str, float]:
        """The sums so far."""
        with self._lock:
            return dict(self._sums)


def _mean_ran(d: dict[str, float], at: str) -> dict[str, float]:
    """``{"mean_ran": ...}`` over the steps under ``at`` whose decoded requests megatron said, else ``{}``."""
    n = d.get(f"{at}/ran_steps", 0)
    return {"mean_ran": d.get(f"{at}/ran", 0) / n} if n else {}


def _graph_sizes(sums: dict[str, float], kind: str) -> list[int]:
    """The captured graphs (batch sizes, smallest first) that ``sums`` count steps of ``kind`` under
    (``{kind}/graph/{size}/...``, as :meth:`StepProfile.add` writes them)."""
    prefix = f"{kind}/graph/"
    return sorted({int(k[len(prefix) :].split("/")[0]) for k in sums if k.startswith(prefix)})


def _graphs(d: dict[str, float], kind: str) -> dict[str, dict[str, float]]:
    """Per captured graph (its batch size as a string, smallest first) the steps of ``kind`` it ran: their count,
    share of the kind's steps, mean ms per step and mean requests decoded (``mean_ran``, where said)."""
    total = d.get(f"{kind}/steps", 0)
    out: dict[str, dict[str, float]] = {}
    for size in _graph_sizes(d, kind):
        at = f"{kind}/graph/{size}"
        n = d.get(f"{at}/steps", 0)
        if n:
            out[str(size)] = {
                "steps": int(n),
                "share": n / total,
                "ms_per_step": 1e3 * d.get(f"{at}/wall_s", 0.0) / n,
                **_mean_ran(d, at),
            }
    return out


def window(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What happened between two snapshots: per kind its steps, share of steps, mean ms per step, mean requests
    active after it and (where megatron said) mean requests decoded in it, and for graph steps the same per
    captured graph (``graphs``, keyed by the graph's batch size); overall the mean requests paused and waiting per
    step, and any steps not recorded (``record_errors``) and dummy forwards (``dummy_forwards``)."""
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
            **_mean_ran(d, kind),
        }
        graphs = _graphs(d, kind)
        if graphs:
            out[kind]["graphs"] = graphs
    if d.get("record_errors"):
        out["record_errors"] = int(d["record_errors"])
    if d.get("dummy_forwards"):
        out["dummy_forwards"] = int(d["dummy_forwards"])
    if steps:
        out["mean_paused"] = d.get("paused", 0) / steps
        out["mean_waiting"] = d.get("waiting", 0) / steps
    return out


def totals(snapshot: dict[str, float]) -> dict[str, Any]:
    """The running sums of a snapshot, for counters (e.g. Prometheus): per kind its steps and seconds
    (``kinds``), per captured decode-only graph its steps, seconds and the requests they decoded (``graphs``, keyed
    by the graph's batch size), and the steps that could not be recorded (``record_errors``)."""
    kinds = {
        kind: {"steps": int(snapshot[f"{kind}/steps"]), "seconds": float(snapshot.get(f"{kind}/wall_s", 0.0))}
        for kind in KINDS
        if snapshot.get(f"{kind}/steps")
    }
    graphs = {
        str(size): {
            "steps": int(snapshot.get(f"decode_graph/graph/{size}/steps", 0)),
            "seconds": float(snapshot.get(f"decode_graph/graph/{size}/wall_s", 0.0)),
            "requests": int(snapshot.get(f"decode_graph/graph/{size}/ran", 0)),
        }
        for size in _graph_sizes(snapshot, "decode_graph")
    }
    return {"kinds": kinds, "graphs": graphs, "record_errors": int(snapshot.get("record_errors", 0))}


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


def _failed(record: Any) -> bool:
    """Whether a finished record is of a request megatron failed at admission (it never ran: megatron-core 0.19.2
    hands such records back with the next step's finished ones)."""
    requests = getattr(record, "requests", None)
    status = getattr(requests[-1], "status", None) if requests else None
    return getattr(status, "name", None) == "FAILED"


def _ran(result: dict[str, Any]) -> int | None:
    """Requests the step decoded: those still active after it plus those it finished, less any failed at admission
    (megatron-core 0.19.2's ``active_request_ids`` and ``finished_request_records``); None where the result lacks
    either."""
    try:
        finished = [r for r in result["finished_request_records"] if not _failed(r)]
        return len(result["active_request_ids"]) + len(finished)
    except (KeyError, TypeError):
        return None


def record_dynamic_step(profile: StepProfile, engine: Any, result: Any, wall_s: float) -> None:
    """Add one step (``step_modern()`` or ``async_step()``) of megatron-core's ``DynamicInferenceEngine`` to
    ``profile``: decode-only or mixed from ``engine.decode_only`` (:func:`_decode_only`), graph or eager from the
    result's ``cuda_graph_request_count`` (for a decode-only step, the batch size of the captured graph it ran; a
    mixed step's graphs share request counts across token counts, so those are not split by graph), the requests
    it decoded and the context's request counts after it (megatron-core 0.19.2 names; a field it lacks makes the
    kind "unknown" or the count 0 or unsaid, never an error in the step)."""
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
    ran = _ran(result) if isinstance(result, dict) else None
    size = graph if isinstance(graph, int) and not isinstance(graph, bool) and graph > 0 else None
    profile.add(kind, wall_s, total - paused, paused, waiting, ran=ran, graph=size if kind == "decode_graph" else None)


def record_step_safely(profile: StepProfile, engine: Any, result: Any, wall_s: float) -> None:
    """:func:`record_dynamic_step`, where a failure to record is counted in the profile (``record_errors``) and
    logged once with its traceback, never raised into the engine's step: the profile is a diagnostic, the step is
    the run."""
    try:
        record_dynamic_step(profile, engine, result, wall_s)
    except Exception:
        if profile.record_error() == 1:
            log.exception("step profile: a step could not be recorded (counted in record_errors; the step ran)")


def profile_async_steps(engine: Any, profile: StepProfile) -> None:
    """Count every step megatron-core's own engine loop runs (coordinator mode) into ``profile``.

    The loop calls ``engine.async_step()`` once per step; this sets a timed wrapper of it on the engine object
    (megatron's class is untouched), which awaits the step and records it (:func:`record_step_safely`). The time
    is the step's wall time in the loop's event loop: what the loop does between steps (scheduling, the
    data-parallel consensus) is not in it, but a coroutine that runs while the step yields to the loop (megatron's
    step awaits ``asyncio.sleep(0)`` inside) is. The loop's dummy forwards (``engine.controller.dummy_forward()``,
    where it has nothing of its own to decode but its last consensus saw work) are counted too, apart from the
    steps (:meth:`StepProfile.add_dummy_forward`). Applying it twice to one engine is refused (the steps
    would count twice)."""
    step = engine.async_step
    if getattr(step, "colo_fsm_profiled", False):
        raise ValueError("profile_async_steps: this engine's steps are already profiled")

    async def timed_step(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        result = await step(*args, **kwargs)
        record_step_safely(profile, engine, result, time.perf_counter() - t)
        return result

    timed_step.colo_fsm_profiled = True  # type: ignore[attr-defined]
    engine.async_step = timed_step
    controller: Any = getattr(engine, "controller", None)
    dummy = getattr(controller, "dummy_forward", None)
    if callable(dummy) and not getattr(dummy, "colo_fsm_profiled", False):

        def counted_dummy(*args: Any, **kwargs: Any) -> Any:
            result = dummy(*args, **kwargs)
            try:
                profile.add_dummy_forward()
            except Exception:  # never into megatron's loop: the profile is a diagnostic
                if profile.record_error() == 1:
                    log.exception("step profile: a dummy forward could not be counted (counted in record_errors)")
            return result

        counted_dummy.colo_fsm_profiled = True  # type: ignore[attr-defined]
        controller.dummy_forward = counted_dummy


MISS_MARGIN = 2
"""Steps megatron's count may run ahead of what the profile saw with none missed: the step under way as the count
is read (megatron counts it before it returns through the wrapper), and one step or dummy forward under way as the
wrappers were set (or whose bookkeeping raised after megatron counted it, which ends the loop)."""


class LoopCheck:
    """Whether megatron's coordinator loop steps where :func:`profile_async_steps` sees it: megatron's own step
    count (``engine.context.step_count``: every step and dummy forward of its loop) against the profile's steps,
    failed records and dummy forwards. A gap past :data:`MISS_MARGIN` is steps the loop ran some other way (a
    megatron-core that no longer steps through the engine object's ``async_step``).

    megatron sets its count back to 0 when it captures its CUDA graphs again (at a resume, in the recompute and
    offload modes where its KV memory moved). The engine tells the check where the loop holds still around a
    resume (:meth:`hold` once SUSPENDED, :meth:`restart` once RESUMED and not yet unpaused), so no step is lost
    there; a count lower than the last one read anywhere else is taken as such a reset and the steps counted
    since it are added (the steps between the last read and the reset are then not, so the gap comes out smaller,
    never larger). The count and the snapshot are read and applied under one lock (:meth:`check`): two readers
    never apply an older count after a newer one. A miss is told once."""

    def __init__(self, count_at_wrap: int) -> None:
        self._lock = threading.Lock()
        self._last = int(count_at_wrap)
        self._counted = 0  # megatron's steps since the wrappers were set, across its resets
        self._told = False

    def _advance(self, count: int) -> None:
        count = int(count)
        self._counted += count - self._last if count >= self._last else count
        self._last = count

    def check(
        self, read_count: Callable[[], int], read_snapshot: Callable[[], dict[str, float]]
    ) -> tuple[dict[str, float], int | None]:
        """The profile's snapshot (``read_snapshot()``), and the steps megatron counted (``read_count()``, read
        first) that reached neither the profile (recorded, or failed to record) nor its dummy forwards, where that
        is past :data:`MISS_MARGIN` for the first time (to be told; None otherwise)."""
        with self._lock:
            count = read_count()  # first: then at most the step under way is missing from the snapshot
            snapshot = read_snapshot()
            self._advance(count)
            seen = snapshot.get("steps", 0) + snapshot.get("record_errors", 0) + snapshot.get("dummy_forwards", 0)
            missed = int(self._counted - seen)
            tell = missed > MISS_MARGIN and not self._told
            self._told = self._told or tell
        return snapshot, missed if tell else None

    def read(self, read_count: Callable[[], int], read_snapshot: Callable[[], dict[str, float]]) -> dict[str, float]:
        """:meth:`check`'s snapshot, a miss logged (once) as a warning that the step series miss those steps."""
        snapshot, missed = self.check(read_count, read_snapshot)
        if missed is not None:
            log.warning(
                "megatron's engine loop counted %d steps that did not reach the step profile: the loop steps some "
                "other way than through engine.async_step (a megatron-core change?), so step_profile() and the "
                "/metrics step series miss them",
                missed,
            )
        return snapshot

    def hold(self, count: int) -> None:
        """megatron's count where its loop holds still (SUSPENDED): every step up to it is counted."""
        with self._lock:
            self._advance(count)

    def restart(self, count: int) -> None:
        """megatron's count after a resume, before its loop runs again (RESUMED, not unpaused): counting goes on
        from it, whether megatron set it back to 0 or not."""
        with self._lock:
            self._last = int(count)


__all__ = [
    "KINDS",
    "MISS_MARGIN",
    "LoopCheck",
    "StepProfile",
    "profile_async_steps",
    "record_dynamic_step",
    "record_step_safely",
    "totals",
    "window",
]
