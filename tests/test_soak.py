"""scripts/soak.py for real: two gloo ranks under torchrun, TP=2 over a tiny megatron-core GPT, parked requests.

A few suspend -> train -> resume cycles with one rank's mode diverging at the last one: no cycle before it
hangs, and the fingerprint barrier names the divergence on both ranks; twenty cycles with checkpoints; and
without the tensor-parallel lockstep the same program desyncs. Two processes importing megatron-core take
~30 s here, so those are slow; the default suite has the merge (hangs are data) below and the two-rank lockstep
schedule in tests/test_lockstep.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def soak(tmp_path: Path, *args: str, timeout: float = 240) -> dict:
    out = tmp_path / "soak.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_port()),
        str(ROOT / "scripts" / "soak.py"),
        "--backend",
        "gloo",
        "--device",
        "cpu",
        "--tp",
        "2",
        "--out",
        str(out),
        "--work-dir",
        str(tmp_path / "work"),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _port() -> int:
    from colo_fsm.adapters.megatron.parallel import free_port

    return free_port()


@pytest.mark.slow  # ~30 s on 2 busy cores (two processes import megatron-core); the fast variants are below
def test_soak_cycles_then_a_mode_divergence_named_on_every_rank(tmp_path):
    r = soak(
        tmp_path,
        *("--cycles", "4", "--save-every", "2", "--inflight", "4", "--gen-ms", "10"),
        *("--diverge-mode-rank", "1", "--diverge-at-cycle", "3", "--nccl-timeout-s", "30", "--barrier-bench", "0"),
    )
    f = r["figures"]
    assert f["hangs"] == 0 and f["desyncs"] == 0, r["ranks"]
    assert f["cycles"] == 3  # cycles 0-2 done on both ranks (one with a checkpoint), cycle 3 diverged
    assert f["checkpoints"] == 1
    assert f["divergence_detected"] and f["divergence_ranks"] == [0, 1]
    assert f["divergence_before_timeout"]
    for rank in r["ranks"]:
        d = rank["divergence"]
        assert d["error"] == "HandoffDivergence" and d["cycle"] == 3
        assert d["mode"] == {"inference_mode": {"False": [0], "True": [1]}}
        assert rank["requests"]["unresolved"] == 0 and rank["requests"]["failed"] == 0
    assert f["handoffs_with_parked_requests"] > 0  # the handoffs parked requests
    assert r["outcome_ok"]
    assert r["what"].startswith("CPU stand-in")


@pytest.mark.slow
def test_soak_twenty_cycles_with_checkpoints_no_hang(tmp_path):
    r = soak(tmp_path, "--cycles", "20", "--save-every", "5", "--barrier-bench", "20")
    f = r["figures"]
    assert (f["cycles"], f["checkpoints"], f["hangs"], f["desyncs"], f["failures"]) == (20, 4, 0, 0, 0)
    assert f["handoffs_with_parked_requests"] == 40  # every handoff of both ranks parked requests
    assert f["fingerprint_over_plain_barrier"] is not None
    for rank in r["ranks"]:
        req = rank["requests"]
        assert req["submitted"] == req["completed"] + req["aborted_at_shutdown"] + req["failed"] + req["unresolved"]
        assert req["failed"] == 0 and req["unresolved"] == 0
        assert req["spanning_rollouts"] > 0


@pytest.mark.slow
def test_without_tp_lockstep_the_same_soak_desyncs(tmp_path):
    """The break the lockstep fixes: each TP rank's engine steps on its own, peers drift by a decode step and a
    handoff barrier times out (gloo names it; the stuck peer is reported as a hang)."""
    r = soak(
        tmp_path,
        *("--cycles", "40", "--save-every", "0", "--gen-ms", "40", "--nccl-timeout-s", "8", "--barrier-bench", "0"),
        "--no-tp-lockstep",
    )
    f = r["figures"]
    assert f["desyncs"] + f["hangs"] >= 1, f
    assert f["cycles"] < 40
    assert not r["outcome_ok"]


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak_script", ROOT / "scripts" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rank_file(out: Path, rank: int, status: str, cycles: int, **extra) -> None:
    cyc = [
        {"cycle": i, "parked": 3, "queued": 0, "handoff_ms": 1.0, "to_training_ms": 1.0, "barrier_ms": 0.5,
         "suspend_ms": 0.2, "resume_ms": 0.1, "train_ms": 2.0, "save_ms": 5.0 if i % 2 else None,
         "train_and_back_ms": 3.0}
        for i in range(cycles)
    ]  # fmt: skip
    rec = {"rank": rank, "status": status, "cycles_done": cycles, "cycles": cyc, **extra}
    work = out.parent / "work"
    work.mkdir(exist_ok=True)
    (work / f"rank{rank}.json").write_text(json.dumps(rec))


def test_merge_reports_a_stuck_rank_as_a_hang_and_a_barrier_timeout_as_a_desync(tmp_path):
    """A rank that neither finished, failed nor diverged (its watchdog or torchrun ended it mid-cycle) is a hang;
    a peer's BarrierTimeout is a desync; the run is not ok, and the figures say so instead of a crash."""
    soak_mod = _soak_module()
    out = tmp_path / "x.json"
    _rank_file(out, 0, "failed", 4, failure={"cause": "BarrierTimeout: barrier timed out after 8s", "cycle": 4})
    _rank_file(out, 1, "running", 4)
    args = argparse.Namespace(
        cycles=10, diverge_mode_rank=None, misorder="none", device="cpu", note="", work_dir=str(tmp_path / "work")
    )
    merged = soak_mod.merge(args, out, 2)
    f = merged["figures"]
    assert (f["hangs"], f["desyncs"], f["failures"], f["cycles"]) == (1, 1, 1, 4)
    assert f["checkpoints"] == 2 and not f["divergence_detected"] and not merged["outcome_ok"]
    assert json.loads(out.read_text())["figures"] == f


def test_merge_of_a_divergence_on_every_rank_is_the_expected_outcome(tmp_path):
    soak_mod = _soak_module()
    out = tmp_path / "y.json"
    div = {"before_timeout": True, "cycle": 3}
    _rank_file(out, 0, "diverged", 3, divergence=div)
    _rank_file(out, 1, "diverged", 3, divergence=div)
    args = argparse.Namespace(
        cycles=10, diverge_mode_rank=1, misorder="none", device="cpu", note="", work_dir=str(tmp_path / "work")
    )
    merged = soak_mod.merge(args, out, 2)
    assert merged["figures"]["divergence_detected"] and merged["figures"]["hangs"] == 0 and merged["outcome_ok"]
    # one rank only would be a failure of the fingerprint barrier, not a detection
    _rank_file(out, 1, "running", 3)
    assert not soak_mod.merge(args, out, 2)["outcome_ok"]
