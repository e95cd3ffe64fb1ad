"""Bounded waits that fail a test by assertion, naming what never came (never by a global timeout)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest


def get_or_fail(q: Any, within_s: float, what: str) -> Any:
    """The next item of the (multiprocessing) queue ``q``; ``pytest.fail`` naming ``what`` when none comes
    within ``within_s`` seconds (a worker hung in a guard that should have raised)."""
    try:
        return q.get(timeout=within_s)
    except queue.Empty:
        pytest.fail(f"nothing within {within_s:g}s: {what}")


def join_or_fail(threads: list[threading.Thread], within_s: float, what: str) -> None:
    """Join every thread, ``within_s`` each; ``pytest.fail`` naming ``what`` and the threads still running."""
    for t in threads:
        t.join(within_s)
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        pytest.fail(f"threads {alive} still running after {within_s:g}s: {what}")


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 20.0, poll_s: float = 0.005) -> None:
    """Poll ``condition()`` until it holds; ``pytest.fail`` naming ``what`` after ``timeout_s`` seconds (a bound for
    a failing run: a passing one waits only for the order the test forces, never for a figure)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)
