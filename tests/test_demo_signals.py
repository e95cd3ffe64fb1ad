"""Real signals to the demo in a subprocess: SIGTERM saves at the next step boundary and stops (exit 143), the
resume loses at most one step; the parent of ``--ranks 2`` forwards the signal, waits for its ranks and prints
the summary; SIGINT and ``--no-save-on-signal`` stop without a save. The signal is sent once the demo printed its
readiness line (``ready: ...``), never after a sleep.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("--prompts-per-step", "2", "--samples-per-group", "2", "--threads", "1", "--no-tensorboard")


class Demo:
    """The demo in a subprocess; its output lines are read on a thread (waits are bounded, on lines)."""

    def __init__(self, run: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "colo_fsm.demo", "--run-dir", str(run), *SMALL, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.out.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, prefix: str, limit_s: float = 180) -> str:
        while True:
            line = self.lines.get(timeout=limit_s)
            assert line is not None, f"the demo ended before a line starting {prefix!r}:\n{''.join(self.out)[-3000:]}"
            if line.startswith(prefix):
                return line

    def children(self) -> list[int]:
        """Pids of this process's rank processes (children started by multiprocessing's spawn)."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    if ppid == self.p.pid and b"spawn_main" in (d / "cmdline").read_bytes():
                        out.append(int(d.name))
                except (OSError, IndexError, ValueError):
                    pass
        return out

    def finish(self, limit_s: float = 240) -> int:
        rc = self.p.wait(timeout=limit_s)
        while self.lines.get(timeout=30) is not None:
            pass
        return rc


def _steps_of(run: Path) -> int:
    """The last step recorded in the metrics (what the interrupted run had done)."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return max(int(r["step"]) for r in lines)


def _sigterm_then_resume(tmp_path: Path, n_ranks: int) -> None:
    ranks = ("--ranks", str(n_ranks)) if n_ranks > 1 else ()
    run = tmp_path / "run"
    demo = Demo(run, "--steps", "100000", "--checkpoint-every", "100000", *ranks)
    demo.wait_line("ready:")
    demo.wait_line("[", limit_s=120)  # a progress line: a step or so under way
    kids = demo.children()
    demo.p.send_signal(signal.SIGTERM)
    rc = demo.finish()
    text = "".join(demo.out)
    assert rc == 128 + signal.SIGTERM, text[-3000:]
    summary = [x for x in demo.out if x.startswith("stopped by SIGTERM")]
    assert summary and "checkpoint saved at step" in summary[0], text[-3000:]
    res = json.loads((run / "result.json").read_text())
    assert res["stopped_by_signal"] == signal.SIGTERM and res["checkpoint_step"] == res["end_step"]
    done = res["end_step"]
    assert (run / "checkpoints" / f"step_{done:08d}").is_dir()
    assert _steps_of(run) == done  # nothing ran after the saved step
    assert len(kids) == (n_ranks if n_ranks > 1 else 0)
    for pid in kids:  # the parent waited for its ranks: none outlives it
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    for r in range(n_ranks):  # every rank's trace is complete: it stopped before the parent exited
        last = json.loads((run / f"trace.rank{r}.jsonl").read_text().splitlines()[-1])
        assert last["dest"] == "Stopped"
    # resume: starts from the saved step; at most the step in progress was lost
    again = Demo(run, "--resume", "--steps", str(done + 2), *ranks)
    assert again.finish() == 0, "".join(again.out)[-3000:]
    res2 = json.loads((run / "result.json").read_text())
    assert res2["start_step"] >= done - 1 and res2["end_step"] == done + 2


@pytest.mark.slow  # two demo runs (~40 s on a busy 2-core machine)
def test_sigterm_saves_at_the_next_step_boundary_then_resume_one_rank(tmp_path):
    _sigterm_then_resume(tmp_path, 1)


@pytest.mark.slow  # two runs of two ranks
def test_sigterm_to_the_parent_of_two_ranks_is_forwarded_waited_for_and_saved(tmp_path):
    _sigterm_then_resume(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "extra"), [(signal.SIGINT, ()), (signal.SIGTERM, ("--no-save-on-signal",))])
def test_sigint_or_no_save_on_signal_stops_without_a_save(tmp_path, sig, extra):
    run = tmp_path / "run"
    demo = Demo(run, "--steps", "100000", "--checkpoint-every", "100000", *extra)
    demo.wait_line("ready:")
    demo.p.send_signal(sig)
    assert demo.finish() == 128 + sig
    res = json.loads((run / "result.json").read_text())
    assert res["stopped_by_signal"] == sig and res["checkpoint_step"] is None
    assert not (run / "checkpoints" / "latest").exists()
