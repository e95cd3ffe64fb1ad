"""Gym chaos against the CPU demo (``tests/support/chaos.py`` in a subprocess): Poisson arrivals from several
clients (completions and chat, streamed or not, ``n`` up to 3), a share abandoned at random points, and handoff
victims abandoned exactly while the engine is suspended (a hook on the gated engine's ``suspend``). The run
finishes; no decode step runs during a handoff; every admitted request is answered or aborted exactly once; no
HTTP request is left in the engine once the clients stop; every token of the server's budget is given back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def chaos(tmp_path: Path, steps: int, clients: int, rate: float, seed: int = 0, *extra: str) -> dict[str, Any]:
    out = tmp_path / "chaos.json"
    args = ["--steps", str(steps), "--clients", str(clients), "--rate", str(rate), "--seed", str(seed), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.chaos", *args, "--run-dir", str(tmp_path / "run"), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-3000:]
    return dict(json.loads(out.read_text()))


def check(report: dict[str, Any], steps: int, min_forced: int) -> None:
    assert report["run"] == {"end_step": steps}, report["run"]  # the run finished, every step
    assert report["decode_steps_while_suspended"] == 0
    assert report["served_during_closed_gate"] == 0
    c, led = report["clients"], report["ledger"]
    assert c["bad"] == [] and c["broken"] == 0, c
    assert c["forced_handoff_aborts"] >= min_forced, c  # cancels that landed while the engine was suspended
    # every admitted request ended exactly once: answered or aborted (none failed: the engine never stopped)
    assert led["open"] == 0 and led["ended_twice"] == 0 and led["failed"] == 0, led
    assert led["admitted"] == led["answered"] + led["aborted"], led
    # a request abandoned at random may have been answered already, or never admitted (not in the ledger)
    assert c["answered"] <= led["answered"] <= c["answered"] + c["abandoned_at_random"], (c, led)
    assert c["forced_handoff_aborts"] <= led["aborted"] <= c["forced_handoff_aborts"] + c["abandoned_at_random"]
    assert led["admitted"] <= c["answered"] + c["abandoned_at_random"] + c["forced_handoff_aborts"]
    assert c["sent"] == c["answered"] + c["refused_429_503"] + c["abandoned_at_random"] + c["forced_handoff_aborts"]
    left = report["server_requests_in_engine_after_clients"]
    assert left and all(x == [0, 0, 0] for x in left), left  # queued, running, parked HTTP requests in the engine
    assert report["tokens_held_at_end"] == 0


def test_chaos_short(tmp_path: Path) -> None:
    report = chaos(tmp_path, steps=14, clients=3, rate=6.0)
    check(report, 14, min_forced=1)


@pytest.mark.slow
def test_chaos_long(tmp_path: Path) -> None:
    # a small token budget and a short wait: some requests wait for room, some get 429 or 503 (Retry-After)
    report = chaos(tmp_path, 300, 6, 4.0, 1, "--inflight-tokens", "150", "--request-timeout", "0.2")  # 60 a request
    check(report, 300, min_forced=30)
    assert report["clients"]["abandoned_at_random"] >= 20
    print(json.dumps({k: report[k] for k in ("steps", "seconds", "clients", "ledger")}))
