"""``colo-fsm demo`` with the ``[megatron]`` extra alone: no FastAPI, uvicorn or Starlette is imported unless
``--serve`` asks for the server, and ``--serve`` without them is refused with one line naming the extra.

The server packages are made unimportable in a subprocess by a ``sitecustomize`` meta-path blocker that also
writes down every attempt to import them, so code that tries and swallows the ImportError is caught too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("fastapi", "uvicorn", "starlette")

BLOCKER = f"""
import os, sys

class _NoServerExtra:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            with open(os.environ["BLOCKED_LOG"], "a") as f:
                f.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {{name!r}} (the [server] extra is not installed)")
        return None

sys.meta_path.insert(0, _NoServerExtra())
"""


def _run(tmp_path: Path, args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, list[str]]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / "blocked.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
        "BLOCKED_LOG": str(log),
    }
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)
    return p, (log.read_text().split() if log.exists() else [])


def test_the_blocker_blocks(tmp_path):
    """The harness can fail: importing the server package under the blocker is seen and refused."""
    p, tried = _run(tmp_path, ["-c", "import colo_fsm.server"], timeout=60)
    assert p.returncode != 0 and "fastapi" in tried


def test_demo_settings_and_entry_point_import_no_server_package(tmp_path):
    code = (
        "import sys; from colo_fsm.demo.config import DemoConfig; import colo_fsm.demo.run, colo_fsm.cli; "
        "DemoConfig(steps=2); print('server modules:', sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{BLOCKED!r}))"
    )
    p, tried = _run(tmp_path, ["-c", code], timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert tried == [] and "server modules: []" in p.stdout


def test_serve_without_the_server_extra_is_one_line_exit_2(tmp_path):
    p, _ = _run(tmp_path, ["-m", "colo_fsm.demo", "--serve", "--run-dir", str(tmp_path / "r")], timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "serve=True" in errors[0] and "[server] extra" in errors[0], p.stderr


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--chat-template", "roles"], "chat_template"),
        (["--on-policy-guard"], "on_policy_guard"),
        (["--server-share", "0.5"], "server_share"),
    ],
)
def test_server_options_without_serve_are_refused_not_ignored(tmp_path, args, field):
    p, tried = _run(tmp_path, ["-m", "colo_fsm.demo", *args, "--run-dir", str(tmp_path / "r")], timeout=120)
    assert p.returncode == 2 and f"{field}=" in p.stderr and "serve=True" in p.stderr, p.stderr[-2000:]
    assert tried == []


@pytest.mark.slow  # a real (two-step) run: ~15 s on a busy 2-core machine, most of it importing megatron-core
def test_demo_runs_without_the_server_extra(tmp_path):
    run = tmp_path / "run"
    p, tried = _run(
        tmp_path,
        [
            "-m",
            "colo_fsm.cli",
            "demo",
            "--run-dir",
            str(run),
            "--steps",
            "2",
            "--prompts-per-step",
            "2",
            "--samples-per-group",
            "2",
            "--threads",
            "1",
            "--no-tensorboard",
        ],
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "done: steps 0->2" in p.stdout and (run / "result.json").exists()
    assert tried == [], f"the demo without --serve tried to import {tried}"
