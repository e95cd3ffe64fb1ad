"""The torch lockstep over a real two-process gloo group: followers take the leader's plan of every iteration.

Two processes (tests/support/lockstep_ranks.py) run one SPMD program over a recording backend, each at its own
pace, with :class:`~colo_fsm.adapters.lockstep.TorchLockstep` over the world group; the leader alone also feeds
requests that the plan must carry to the follower (one ended early by the leader's own ``on_token``). Both
backends must see the identical call sequence. The mutant where every rank plans its own iteration (the same
broadcasts, the leader's plan ignored) gives two different sequences: the assertion goes red.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _two_ranks(tmp_path: Path, mode: str, feed: bool = True) -> list[dict]:
    from colo_fsm.adapters.megatron.parallel import free_port

    init = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.lockstep_ranks",
                str(r),
                "2",
                init,
                mode,
                str(outs[r]),
                "feed" if feed else "spmd",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    logs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)  # each rank bounds its own waits (20 s): this never fires first
        logs.append(out)
    recs = []
    for r, path in enumerate(outs):
        assert path.exists(), f"rank {r} wrote nothing:\n{logs[r][-3000:]}"
        recs.append(json.loads(path.read_text()))
    return recs


def test_torch_lockstep_two_gloo_ranks_issue_one_schedule_with_fed_requests(tmp_path):
    a, b = _two_ranks(tmp_path, "lockstep")
    assert a["log"] == b["log"], f"the follower's backend calls differ from the leader's: {b['error']}"
    assert a["error"] is None and b["error"] is None, (a["error"], b["error"])
    steps = [c for c in a["log"] if c[0] == "step"]
    fed_rows = {rid for c in steps for rid in c[1] if rid >= 1 << 48}
    assert len(fed_rows) == 6  # every leader-only request reached the follower's backend
    assert a["log"].count(["suspend"]) == 3
    assert a["results"]["fed"] == [[5, "length"], [2, "stop"]] * 3  # on_token ended one after 2 tokens
    assert a["results"]["spmd"] == b["results"]["spmd"]


@pytest.mark.slow  # the mutant's ranks fall out of step and wait out the group's 20 s timeout
def test_followers_that_plan_their_own_iteration_are_caught(tmp_path):
    """The property can fail: every rank planning its own iteration gives a different schedule (or an error)."""
    a, b = _two_ranks(tmp_path, "own-plan", feed=False)
    assert a["log"] != b["log"] or a["error"] or b["error"]
