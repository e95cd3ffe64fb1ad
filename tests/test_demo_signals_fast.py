"""The parent of a multi-rank demo and its signals, fast: real processes that stand in for the ranks
(tests/support/signal_children.py). SIGTERM to the parent reaches every rank and the parent returns once they
stopped, with the signal; ranks that ignore it are killed at the bound (or at a second signal) and the parent
says so with :class:`~colo_fsm.errors.RanksDidNotStop`. The end-to-end runs are in tests/test_demo_signals.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from colo_fsm.demo.signals import run_ranks_forwarding_signals
from colo_fsm.errors import RanksDidNotStop


class _Ranks:
    """What ``torch.multiprocessing.start_processes(join=False)`` returns, over plain stdlib processes (no torch
    import in the children: each starts in well under a second)."""

    def __init__(self, folder: Path, mode: str) -> None:
        import multiprocessing as mp

        from tests.support.signal_children import child

        ctx = mp.get_context("spawn")
        self.processes = [ctx.Process(target=child, args=(i, str(folder), mode)) for i in (0, 1)]
        for p in self.processes:
            p.start()

    def join(self, timeout: float) -> bool:
        for p in self.processes:
            p.join(timeout / len(self.processes))
        return not any(p.is_alive() for p in self.processes)


def _start(folder: Path, mode: str):
    return lambda: _Ranks(folder, mode)


def _signal_when_ready(folder: Path, *signums: int) -> threading.Thread:
    """Send ``signums`` to this process once both stand-ins wrote their readiness file."""

    def go() -> None:
        deadline = time.monotonic() + 120
        while not all((folder / f"ready.{i}").exists() for i in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.02)
        for s in signums:
            os.kill(os.getpid(), s)
            time.sleep(0.2)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_sigterm_to_the_parent_is_forwarded_and_waited_for(tmp_path):
    _signal_when_ready(tmp_path, signal.SIGTERM)
    try:
        got: object = run_ranks_forwarding_signals(_start(tmp_path, "stop"), stop_timeout_s=60)
    except RanksDidNotStop as exc:  # reported by the assertion below
        got = exc
    assert got == signal.SIGTERM
    assert [(tmp_path / f"got.{i}").exists() for i in (0, 1)] == [True, True]  # every rank got it
    assert signal.getsignal(signal.SIGTERM) is not None  # the parent's own handler is back


def test_ranks_that_do_not_stop_are_killed_at_the_bound(tmp_path):
    _signal_when_ready(tmp_path, signal.SIGTERM)
    ctx = {}

    def start():
        ctx["c"] = _start(tmp_path, "deaf")()
        return ctx["c"]

    with pytest.raises(RanksDidNotStop, match="stop_timeout_s=0.5"):
        run_ranks_forwarding_signals(start, stop_timeout_s=0.5)
    assert not any(p.is_alive() for p in ctx["c"].processes)


def test_a_second_signal_kills_the_ranks_at_once(tmp_path):
    _signal_when_ready(tmp_path, signal.SIGTERM, signal.SIGINT)
    with pytest.raises(RanksDidNotStop, match="a second signal"):
        run_ranks_forwarding_signals(_start(tmp_path, "deaf"), stop_timeout_s=300)
