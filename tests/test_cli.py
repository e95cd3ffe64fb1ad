"""The ``colo-fsm`` command line, through its real entry point in a subprocess (and in-process for hooks)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from colo_fsm import cli, diagram

ROOT = Path(__file__).resolve().parents[1]


def _entry_point() -> list[str]:
    script = Path(sys.executable).parent / "colo-fsm"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "colo_fsm.cli"]


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_entry_point(), *args], cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr
    assert len(err.splitlines()) == 1, f"expected a one-line error, got:\n{err}"
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"


# ---------------------------------------------------------------------------------------------- diagram
@pytest.mark.parametrize("fmt", ["mermaid", "dot", "markdown"])
def test_diagram_prints_each_format(fmt: str) -> None:
    proc = run("diagram", "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == diagram.diagram_text(fmt)


def test_diagram_writes_files_by_suffix(tmp_path: Path) -> None:
    proc = run("diagram", "-o", str(tmp_path / "a.mmd"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.mmd").read_text() == diagram.to_mermaid()
    proc = run("diagram", "--output", str(tmp_path / "sub" / "a.dot"), "--direction", "LR", "--failure", "edges")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "sub" / "a.dot").read_text() == diagram.to_dot(rankdir="LR", failure="edges")


def test_diagram_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    assert_user_error(run("diagram", "--format", "plantuml"), "--format", "mermaid", "dot", "markdown")
    assert_user_error(run("diagram", "--format", "mermaid", "-o", str(tmp_path / "x.png")), "--output", "--format dot")
    assert_user_error(run("diagram", "--frobnicate"), "--frobnicate")
    assert_user_error(run("simulate", "--steps", "0"), "--steps", ">= 1")
    assert_user_error(run("simulate", "--steps", "many"), "--steps", "int")
    assert_user_error(run("simulate", "--fail-at", "gpu.melt"), "--fail-at", "trainer.save_checkpoint")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")
def test_diagram_renders_png(tmp_path: Path) -> None:
    proc = run("diagram", "-o", str(tmp_path / "lifecycle.png"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "lifecycle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diagram_png_without_graphviz_says_how_to_install(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()  # a PATH on which there is no dot
    proc = subprocess.run(
        [sys.executable, "-m", "colo_fsm.cli", "diagram", "-o", str(tmp_path / "lifecycle.svg")],
        cwd=ROOT, env={**os.environ, "PATH": str(bare)}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert_user_error(proc, "--output", "apt-get install graphviz", "brew install graphviz", "conda", "--format svg")
    assert not (tmp_path / "lifecycle.svg").exists()


def test_update_and_check_docs(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# x\n<!-- BEGIN GENERATED: mermaid -->\n<!-- END GENERATED: mermaid -->\n"
                    "<!-- BEGIN GENERATED: transitions -->\nstale\n<!-- END GENERATED: transitions -->\n")  # fmt: skip
    stale = run("diagram", "--check-docs", str(page))
    assert stale.returncode == 1 and "mermaid, transitions" in stale.stdout and "--update-docs" in stale.stdout
    assert "stale" in page.read_text()
    assert run("diagram", "--update-docs", str(page)).returncode == 0
    assert diagram.to_mermaid() in page.read_text()
    fresh = run("diagram", "--check-docs", str(page))
    assert fresh.returncode == 0 and "up to date" in fresh.stdout
    assert_user_error(run("diagram", "--check-docs", str(tmp_path / "none.md")), "none.md")


def test_repository_docs_are_current() -> None:
    proc = run("diagram", "--check-docs", "docs/lifecycle.md")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------- simulate + timeline
def test_simulate_then_timeline(tmp_path: Path) -> None:
    trace = tmp_path / "sim.jsonl"
    proc = run("simulate", "--steps", "4", "--ranks", "2", "--pace", "0.001", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"Generating -\[begin_step\]->\s+Draining ", out)
    assert re.search(r"Training -\[conclude\]->\s+Checkpointing ", out) and "Validating" in out
    for r in (0, 1):
        assert f"rank {r}: Stopped after 4 step(s), weight version 4, engine built 1x" in out
    traces = [tmp_path / f"sim.rank{r}.jsonl" for r in (0, 1)]
    assert all(p.is_file() for p in traces)
    png = tmp_path / "timeline.png"
    proc = run("timeline", *map(str, traces), "-o", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # the same command again would append a second run to each trace: refused, the traces left as they were
    before = [p.read_bytes() for p in traces]
    again = run("simulate", "--steps", "4", "--ranks", "2", "--trace", str(trace))
    assert again.returncode == 2 and again.stdout == "", again.stdout
    assert f"argument --trace: {traces[0]} is a trace of {len(before[0])} bytes" in again.stderr, again.stderr
    assert "remove it or choose another path" in again.stderr and "Traceback" not in again.stderr
    assert [p.read_bytes() for p in traces] == before


def test_simulate_injected_failure_reaches_failed_then_stopped(tmp_path: Path) -> None:
    proc = run(
        "simulate", "--steps", "4", "--fail-at", "trainer.save_checkpoint@1", "--trace", str(tmp_path / "f.jsonl")
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"Checkpointing -\[fail\]->\s+Failed ", proc.stdout)
    assert re.search(r"Failed -\[stop\]->\s+Stopped ", proc.stdout)
    assert "rank 0: Failed: action 'save_checkpoint'" in proc.stdout


def test_timeline_errors_name_the_file_and_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    assert_user_error(run("timeline", str(missing), "-o", str(tmp_path / "t.png")), str(missing), "no such trace file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"rank": 0, "source": "A", "dest": "B", "trigger": "t", "t_start": 1, "t_enter": 1, "t_end": 1}\n'
                   "not json\n")  # fmt: skip
    assert_user_error(run("timeline", str(bad), "-o", str(tmp_path / "t.png")), f"{bad}:2", "not JSON")
    assert_user_error(run("timeline", str(bad), "-o", str(tmp_path / "t.txt")), "--output", ".png")
    assert_user_error(run("timeline"), "TRACE.jsonl")


def test_no_command_prints_help() -> None:
    proc = run()
    assert proc.returncode == 2 and "diagram" in proc.stdout and "timeline" in proc.stdout


# ---------------------------------------------------------------------------------------------- demo / check hooks
def test_demo_hook_registers_the_demo_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, object] = {}

    def register(subparsers: object) -> None:
        p = subparsers.add_parser("demo", help="fake demo")  # type: ignore[attr-defined]
        p.add_argument("--steps", type=int, default=1)
        p.set_defaults(func=lambda args: seen.setdefault("steps", args.steps) and 0)

    monkeypatch.setitem(sys.modules, "colo_fsm.demo", types.ModuleType("colo_fsm.demo"))
    monkeypatch.setitem(sys.modules, "colo_fsm.demo.cli", types.SimpleNamespace(register=register))
    assert cli.main(["demo", "--steps", "3"]) == 0
    assert seen == {"steps": 3}


def test_demo_hook_when_the_demo_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "colo_fsm.demo", None)  # import of colo_fsm.demo raises ModuleNotFoundError
    assert cli.main(["demo", "--anything"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unavailable" in err and "colo-fsm simulate" in err


def test_check_hook_passes_argv(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    got: list[list[str]] = []
    monkeypatch.setitem(
        sys.modules, "colo_fsm.testing.checker", types.SimpleNamespace(main=lambda a: got.append(a) or 3)
    )
    assert cli.main(["check", "--ranks", "4"]) == 3
    assert got == [["--ranks", "4"]]
    monkeypatch.setitem(sys.modules, "colo_fsm.testing.checker", None)
    assert cli.main(["check"]) == 2
    assert "unavailable" in capsys.readouterr().err


def test_help_lists_every_command_without_importing_torch() -> None:
    code = "import sys; from colo_fsm import cli; cli.build_parser(['diagram']); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip() == "False", proc.stderr
    helptext = run("--help").stdout
    for name in ("diagram", "timeline", "simulate", "demo", "check"):
        assert name in helptext
