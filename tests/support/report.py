"""Numbers colo-fsm's own tests report (programs run, states explored, mutants killed, faults injected).

:func:`record_stats` merges one key into the JSON file named by ``$COLO_FSM_STATS_PATH``, and writes nothing when
it is unset (so a test run writes nowhere but pytest's tmp paths unless asked), e.g.
``COLO_FSM_STATS_PATH=bench/results/testing_stats.json make test``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
STATS_ENV = "COLO_FSM_STATS_PATH"


def stats_path() -> Path | None:
    """Where :func:`record_stats` writes, or None."""
    value = os.environ.get(STATS_ENV)
    return Path(value) if value else None


def record_stats(key: str, value: Any, path: Path | None = None) -> None:
    """Merge ``{key: value}`` into the stats file (written at once, so a partial run keeps what it measured)."""
    target = path or stats_path()
    if target is None:
        return
    with _LOCK:
        try:
            data = json.loads(target.read_text(encoding="utf-8")) if target.exists() else {}
        except ValueError:
            data = {}
        data[key] = value
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(target)


__all__ = ["STATS_ENV", "record_stats", "stats_path"]
