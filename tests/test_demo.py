"""The demo end to end (a short run in a subprocess), its resume, its run folder and its argument errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from colo_fsm.collector.metrics import state_times_per_step
from colo_fsm.machine.trace import read_trace

ROOT = Path(__file__).resolve().parent.parent


def _demo(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "colo_fsm.demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_short_demo_end_to_end_then_resume(tmp_path):
    run = tmp_path / "run"
    # 8 steps; validation every 3, checkpoint every 6: step 6 both checkpoints and validates; stop after 6
    p = _demo(
        "--run-dir",
        str(run),
        "--steps",
        "8",
        "--validate-every",
        "3",
        "--checkpoint-every",
        "6",
        "--prompts-per-step",
        "4",
        "--samples-per-group",
        "4",
        "--stop-after",
        "6",
        "--threads",
        "1",
        env={"CUDA_HOME": str(tmp_path)},  # a CUDA toolkit and no GPU: torch logs a notice, the CPU demo drops it
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "engine: backend=cpu" in out and "checkpoint saved" in out and "validation at step 6" in out
    assert "No CUDA runtime" not in out + p.stderr, p.stderr[-2000:]  # see the test after this one
    for name in (
        "trace.rank0.jsonl",
        "metrics.jsonl",
        "lifecycle.mmd",
        "lifecycle.svg",
        "timeline.png",
        "config.json",
        "checkpoints/latest",
        "checkpoints/step_00000006",
    ):
        assert (run / name).exists(), name
    assert list((run / "tensorboard").iterdir())
    trace = _records(run / "trace.rank0.jsonl")
    dests = [r["dest"] for r in trace]
    i = dests.index("Checkpointing")
    assert dests[i + 1] == "Validating"  # Training -> Checkpointing -> Validating
    assert dests.count("Starting") == 1  # the engine was built once
    # the handoff is short: by default (--inflight park) it parks the rollouts in flight instead of waiting for
    # them, so generation happens in Generating, not inside Draining
    times: dict[str, float] = {}
    for per_step in state_times_per_step(read_trace(run / "trace.rank0.jsonl")):
        for state, seconds in per_step.items():
            times[state] = times.get(state, 0.0) + seconds
    assert times["Generating"] > times.get("Draining", 0.0), times
    metrics = _records(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert metrics[-1]["collector/failed"] == 0
    assert "inflight=park" in out and re.search(r"requests +\d+ running +\d+ queued +\d+ parked", out)
    assert all("elapsed_s" in m and "train/consumed_samples" in m for m in metrics)
    assert metrics[-1]["train/consumed_samples"] == 6 * 4 * 4
    assert "val/accuracy" in metrics[2] and "val/accuracy" in metrics[5]
    assert all("val/accuracy" not in m for i, m in enumerate(metrics) if i not in (2, 5))
    # time in each state per step, accumulated from the trace as it grows
    assert all(m["time/Training_s"] > 0 and m["time/Draining_s"] > 0 for m in metrics), metrics
    assert "time/Checkpointing_s" in metrics[5] and all("time/Checkpointing_s" not in m for m in metrics[:5])
    assert "time/Validating_s" in metrics[2] and "time/Validating_s" not in metrics[3]
    elapsed_before_save = metrics[4]["elapsed_s"]  # step 5: logged before step 6 saved the checkpoint

    # resume: continues at step 6 / weight version 6 with the saved buffer, runs to the end (8)
    p = _demo(
        "--run-dir",
        str(run),
        "--resume",
        "--steps",
        "8",
        "--validate-every",
        "3",
        "--checkpoint-every",
        "6",
        "--prompts-per-step",
        "4",
        "--samples-per-group",
        "4",
        "--threads",
        "1",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resumed from" in p.stdout and "step 6, weight version 6" in p.stdout
    assert re.search(r"\d+ deferred or parked prompts to roll out first", p.stdout)  # restored from the checkpoint
    result = json.loads((run / "result.json").read_text())
    assert (result["start_step"], result["end_step"], result["weight_version"]) == (6, 8, 8)
    assert result["consumed_samples"] == 8 * 4 * 4  # nothing lost, nothing counted twice
    metrics = _records(run / "metrics.jsonl")
    assert [m["step"] for m in metrics][-2:] == [7, 8]
    # wall-clock continues from the checkpoint (elapsed_offset_s saved with it) instead of restarting at 0
    assert metrics[-2]["elapsed_s"] > elapsed_before_save, (metrics[-2], elapsed_before_save)
    assert metrics[-1]["time/Training_s"] > 0
    trace = _records(run / "trace.rank0.jsonl")
    assert trace[-1]["dest"] == "Stopped"
    resumed_start = [r for r in trace if r["trigger"] == "start"]
    assert len(resumed_start) == 2 and resumed_start[1]["weight_version"] == 6


def test_torch_would_log_a_cuda_runtime_notice_under_cuda_home(tmp_path):
    """The condition the demo's end-to-end run is started under (CUDA_HOME set, no GPU): torch does log its notice
    there, so that test's "no notice" is not vacuous. Skips where this torch logs none (a CPU-only build, a GPU)."""
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "CUDA_PATH": ""}
    probe = subprocess.run(
        [sys.executable, "-c", "import torch.utils.cpp_extension"], capture_output=True, text=True, timeout=120, env=env
    )
    if "No CUDA runtime is found" not in probe.stderr:
        pytest.skip("torch logs no CUDA-runtime notice here (a CPU-only torch, or a GPU): nothing to silence")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--steps", "0"], "--steps"),
        (["--kv-cache-mode", "keep"], "kv_cache_mode='keep': expected one of 'persist', 'offload', 'recompute'"),
        (["--hidden-size", "30"], "hidden_size=30: expected a multiple of num_attention_heads=4"),
        (["--samples-per-group", "1"], "samples_per_group=1: expected an integer >= 2"),
        (["--device", "tpu"], "--device"),
        (["--inflight", "pause"], "--inflight"),
    ],
)
def test_bad_arguments_one_line_exit_2(args, needle, tmp_path):
    p = _demo("--run-dir", str(tmp_path / "r"), *args, timeout=60)
    assert p.returncode == 2
    lines = [line for line in p.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_resume_without_a_checkpoint_is_a_config_error(tmp_path):
    p = _demo("--run-dir", str(tmp_path / "empty"), "--resume", timeout=60)
    assert p.returncode == 2
    assert "run_dir=" in p.stderr and "checkpoints/latest" in p.stderr


@pytest.mark.slow
def test_demo_two_gloo_ranks(tmp_path):
    run = tmp_path / "run2"
    p = _demo(
        "--run-dir",
        str(run),
        "--ranks",
        "2",
        "--steps",
        "6",
        "--validate-every",
        "3",
        "--checkpoint-every",
        "3",
        "--prompts-per-step",
        "4",
        "--samples-per-group",
        "4",
        "--threads",
        "1",
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert (run / "trace.rank0.jsonl").exists() and (run / "trace.rank1.jsonl").exists()
    result = json.loads((run / "result.json").read_text())
    assert result["weight_version"] == 6 and result["consumed_samples"] == 6 * 4 * 4 * 2


def test_progress_display_plain_lines_and_tty_rewrites():
    import io

    from colo_fsm.demo.progress import ProgressDisplay

    plain = io.StringIO()
    d = ProgressDisplay(20, stream=plain, every=10, tty=False)
    for step in range(1, 21):
        d.update(
            state="Generating", step=step, weight_version=step, reward=0.5, consumed=64 * step, samples_per_s=100.0
        )
    d.event("checkpoint saved")
    lines = plain.getvalue().splitlines()
    assert len(lines) == 3 and "step   10/20" in lines[0] and "wv   20" in lines[1] and "consumed    1280" in lines[1]
    assert "\r" not in plain.getvalue()
    tty = io.StringIO()
    d = ProgressDisplay(5, stream=tty, tty=True)
    d.update(state="Draining", step=1, weight_version=1, reward=0.1, consumed=64, samples_per_s=10.0)
    d.update(state="Generating", step=2, weight_version=2, reward=0.2, consumed=128, samples_per_s=10.0)
    d.close()
    out = tty.getvalue()
    assert out.count("\r\x1b[2K") == 2 and "Draining" in out and out.endswith("\n")


def test_progress_line_shows_the_requests_parked_through_the_latest_handoff():
    import io
    from types import SimpleNamespace

    from colo_fsm.demo.progress import ProgressDisplay

    counts = [SimpleNamespace(running=12, queued=3, parked=0)]
    tty = io.StringIO()
    d = ProgressDisplay(5, stream=tty, tty=True, tty_interval_s=0.0, requests=lambda: counts[0])
    d.transition("Generating", step=0, weight_version=0, resting=True)
    assert "12 running   3 queued   0 parked" in tty.getvalue().rsplit("\r", 1)[-1]
    counts[0] = SimpleNamespace(running=0, queued=3, parked=12)  # suspended: the 12 requests are parked
    d.transition("Draining", step=0, weight_version=0)
    d.transition("Training", step=0, weight_version=0)
    counts[0] = SimpleNamespace(running=14, queued=1, parked=0)  # resumed: they run again
    d.transition("Waking", step=1, weight_version=1)
    d.update(state="Generating", step=1, weight_version=1, reward=0.0, consumed=8, samples_per_s=1.0)
    last = tty.getvalue().rsplit("\r", 1)[-1]
    assert "14 running   1 queued  12 parked" in last, last  # parked: how many the latest handoff kept


def test_progress_follows_every_transition_so_checkpointing_and_validating_show():
    """The display subscribes to the lifecycle's trace: states inside a step (Checkpointing, Validating) show
    up, throttled on a TTY (resting states always redraw) and in plain mode (line-based, at most one line per
    interval)."""
    import io

    from colo_fsm import CheckpointDecision, Lifecycle, LifecycleConfig, ValidationDecision
    from colo_fsm.demo.progress import ProgressDisplay, follow
    from colo_fsm.testing.fakes import recording_adapters

    def run(display):
        _j, e, t, c, d = recording_adapters()
        lc = Lifecycle(
            e,
            t,
            c,
            drain=d,
            config=LifecycleConfig(num_steps=3),
            checkpoint=CheckpointDecision(1),
            validation=ValidationDecision(1),
            validator=lambda step, wv: {"val/accuracy": 1.0},
        )
        follow(display, lc.trace, lc.spec)
        lc.start()
        while not lc.finished:
            lc.step([1])
        display.close()

    tty = io.StringIO()
    run(ProgressDisplay(3, stream=tty, tty=True, tty_interval_s=0.0))
    shown = tty.getvalue()
    for state in ("Starting", "Draining", "Training", "Checkpointing", "Validating", "Generating", "Done"):
        assert state in shown, state
    clock = iter(range(1000))  # one "second" per clock read: every plain line is past the interval
    plain = io.StringIO()
    run(ProgressDisplay(3, stream=plain, tty=False, plain_interval_s=1.0, clock=lambda: float(next(clock))))
    out = plain.getvalue()
    assert "\r" not in out and "Checkpointing" in out and "Validating" in out
    slow = io.StringIO()  # a frozen clock: throttled to nothing but the first line
    run(ProgressDisplay(3, stream=slow, tty=False, plain_interval_s=5.0, clock=lambda: 0.0))
    assert len(slow.getvalue().splitlines()) == 1
