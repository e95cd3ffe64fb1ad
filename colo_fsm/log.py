"""Lifecycle context in every colo-fsm log line, and progress lines for long lifecycle work.

Every logger colo-fsm uses comes from ``get_logger(__name__)``: it prefixes each message with the rank, state,
weight version and step of the process's active lifecycle (``[rank=0 state=Training wv=12 step=12]``) and
sets them as ``extra`` fields (``record.rank`` etc.) for structured handlers. The context is process-wide: in
SPMD runs there is one rank per process; where several lifecycles share a process (thread-ranks in tests) the
most recently active one is named, except in the lifecycle's own lines, which pass their own position as
``extra`` (one mechanism, :meth:`LifecycleLogger.process`, formats both with :func:`format_prefix`).

A single daemon thread (:class:`_Heartbeat`) logs a progress line while an action of any lifecycle runs longer
than that lifecycle's ``progress_interval_s`` (a barrier waiting for a slow rank, a long checkpoint save), so a
stuck run says where it is stuck.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from typing import Any

_context: dict[str, Any] = {}
_KEYS = ("rank", "state", "weight_version", "step")


def set_context(*, rank: int, state: str, weight_version: int, step: int) -> None:
    """Record the active lifecycle's position (called by the machine on every transition)."""
    _context.update(rank=rank, state=state, weight_version=weight_version, step=step)


def context() -> dict[str, Any]:
    """The active lifecycle's rank, state, weight version and step (empty before any lifecycle ran)."""
    return dict(_context)


def format_prefix(*, rank: int, state: str, weight_version: int, step: int) -> str:
    """``[rank=.. state=.. wv=.. step=..] ``: the one format every lifecycle line starts with."""
    return f"[rank={rank} state={state} wv={weight_version} step={step}] "


def prefix() -> str:
    """:func:`format_prefix` for the active lifecycle, or ``""``."""
    c = _context
    return format_prefix(**c) if c else ""


class LifecycleLogger(logging.LoggerAdapter):
    """A logger adapter that names the active lifecycle's rank, state and weight version in every line."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        """Prefix ``msg`` with the position given in ``extra`` (a lifecycle logging its own lines passes its
        rank, state, weight version and step), else with the process's active lifecycle, if any."""
        extra = dict(kwargs.get("extra") or {})
        own = all(key in extra for key in _KEYS)
        if not own and not _context:
            return msg, kwargs
        for key in _KEYS:
            extra.setdefault(key, _context.get(key))
        kwargs["extra"] = extra
        return format_prefix(**{k: extra[k] for k in _KEYS}) + str(msg), kwargs


def get_logger(name: str) -> LifecycleLogger:
    """The logger ``name`` (a module's ``__name__``), wrapped to carry the lifecycle context."""
    return LifecycleLogger(logging.getLogger(name), {})


class _Heartbeat:
    """One daemon thread per process that reports actions running longer than their lifecycle's interval."""

    def __init__(self) -> None:
        self._watched: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self.tick_s = 1.0

    def set_tick(self, seconds: float) -> None:
        """How often the thread looks (1 s by default); takes effect at once."""
        self.tick_s = seconds
        self._wake.set()

    def watch(self, lifecycle: Any) -> None:
        with self._lock:
            self._watched.add(lifecycle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="colo-fsm-heartbeat", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.tick_s)
            self._wake.clear()
            with self._lock:
                watched = list(self._watched)
            now = time.monotonic()
            for lc in watched:
                report: Callable[[float], None] | None = getattr(lc, "_report_progress", None)
                if report is not None:
                    try:
                        report(now)
                    except Exception:  # a progress line must never hurt the run
                        logging.getLogger(__name__).debug("progress report failed", exc_info=True)


heartbeat = _Heartbeat()

__all__ = ["LifecycleLogger", "context", "format_prefix", "get_logger", "heartbeat", "prefix", "set_context"]
