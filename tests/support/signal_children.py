"""Stand-ins for the ranks of a multi-rank demo (tests/test_demo_signals_fast.py): each installs a SIGTERM handler,
writes ``ready.<i>`` and then either stops on the signal (writing ``got.<i>``) or ignores it (``mode="deaf"``)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any


def child(i: int, folder: str, mode: str) -> None:
    """One rank: wait for SIGTERM (bounded), record it, return; a deaf one never returns by itself."""
    got = threading.Event()

    def on_term(signum: int, _frame: Any) -> None:
        if mode != "deaf":
            (Path(folder) / f"got.{i}").write_text(str(signum))
            got.set()

    signal.signal(signal.SIGTERM, on_term)
    (Path(folder) / f"ready.{i}").write_text("1")
    got.wait(120 if mode != "deaf" else 600)
