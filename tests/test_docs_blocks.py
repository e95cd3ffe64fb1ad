"""Every code block in README.md and docs/ runs here, or says in the page why it cannot.

The convention, for whoever writes a page:

* Every fence names its language. ``python`` and ``bash`` blocks are code and run; ``text`` (program output,
  trees), ``mermaid`` (diagrams: those generated from the spec are checked by tests/test_docs_drift.py),
  ``toml``, ``yaml``, ``json`` and ``ini`` are shown, never run.
* ``<!-- fragment: REASON -->`` on the line right before a fence: the block is not run, and REASON (required)
  says why, e.g. ``<!-- fragment: needs a GPU -->`` or ``<!-- fragment: takes minutes; tests/test_demo.py runs it -->``.
* ``<!-- slow: REASON -->`` right before a fence: the block runs only in the slow variant of the page's test
  (``make test-deep``), e.g. one that starts a Ray cluster; REASON says why.
* ``<!-- file: NAME -->`` right before a fence: the block is written to NAME in the page's folder instead of
  run (a ``conftest.py`` or a script), for a later block to use.
* A page's blocks run in page order in one fresh process whose working directory is a temporary folder holding
  a copy of ``docs/``: ``python`` blocks share one namespace (a later block may use an earlier block's names,
  as in a notebook), ``bash`` blocks run with ``bash -euo pipefail`` with this interpreter's ``bin/`` first on
  ``PATH`` (so ``colo-fsm`` and ``python`` are the project's).

A failure names the page and the line of the block's opening fence. Keep blocks cheap: a page runs in seconds
(the megatron-core ones on the tiny CPU model).

A block that runs a training loop (``while not lc.finished``, or a bash block running a file block with one) runs
five times, each after the first in a folder of its own, with a CPU hog on every core but one for the whole page:
each run must end cleanly and nothing may print a traceback or a failed rollout
(``test_page_loops_run_five_times_under_load``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = {"python", "bash"}
SHOWN = {"text", "mermaid", "toml", "yaml", "json", "ini"}
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)")
_MARK = re.compile(r"^\s*<!--\s*(fragment|file|slow)\s*:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, first line (1-based, the fence) and text."""

    page: str
    line: int
    lang: str
    text: str
    mark: str | None = None  # "fragment", "slow" or "file"
    arg: str = ""  # the fragment's reason or the file's name


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (the API pages hold no fences, only directives)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of ``path``, with the marker comment right before each, if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = str(path.relative_to(root))
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if j == len(lines):
            raise AssertionError(f"{rel}:{i + 1}: the fence opened here is never closed")
        body = "\n".join(ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j])
        mark = _MARK.match(lines[i - 1]) if i > 0 else None
        out.append(Block(rel, i + 1, lang, body + "\n", mark.group(1) if mark else None, mark.group(2) if mark else ""))
        i = j + 1
    return out


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def test_every_block_is_run_or_says_why_not() -> None:
    """Every fence names a known language, and every marker is complete and sits before a block it fits."""
    problems: list[str] = []
    for path in pages():
        for b in blocks(path):
            where = f"{b.page}:{b.line}"
            if b.lang not in RUN | SHOWN:
                problems.append(f"{where}: fence language {b.lang!r}; expected one of {sorted(RUN | SHOWN)}")
            if b.mark is not None and not b.arg:
                problems.append(f"{where}: '<!-- {b.mark}: -->' needs a reason / file name after the colon")
            if b.mark is not None and b.lang not in RUN:
                problems.append(f"{where}: a {b.lang!r} block is never run; drop the '{b.mark}' marker")
            if b.mark == "file" and ("/" in b.arg or b.arg.startswith(".")):
                problems.append(f"{where}: '<!-- file: {b.arg} -->' must be a plain file name")
    assert not problems, "\n".join(problems)


def test_the_block_reader_sees_markers_and_languages(tmp_path: Path) -> None:
    """The reader itself: languages, markers right before a fence only, indented fences, line numbers."""
    page = tmp_path / "p.md"
    page.write_text(
        "intro\n```python\nx = 1\n```\n<!-- fragment: needs a GPU -->\n```bash\nnvidia-smi\n```\n"
        "<!-- file: conftest.py -->\n\n```python\nnot_marked = 1\n```\n- item\n\n  ```text\n  out\n  ```\n",
        encoding="utf-8",
    )
    got = [(b.line, b.lang, b.mark, b.arg, b.text) for b in blocks(page, root=tmp_path)]
    assert got == [
        (2, "python", None, "", "x = 1\n"),
        (6, "bash", "fragment", "needs a GPU", "nvidia-smi\n"),
        (11, "python", None, "", "not_marked = 1\n"),  # a blank line between marker and fence: not marked
        (16, "text", None, "", "out\n"),  # an indented fence (in a list)
    ]


_DRIVER = r"""
import json, os, shutil, subprocess, sys, time, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__doc_page__"}
t = time.monotonic()
home = os.getcwd()
files = []
for b in blocks:
    where = f"{b['page']}:{b['line']}"
    if b["mark"] == "file":
        print(f"--- {where} ({b['lang']}) at {time.monotonic() - t:.1f}s", flush=True)
        open(b["arg"], "w").write(b["text"])
        files.append(b["arg"])
        continue
    for k in range(b.get("repeat", 1)):
        print(f"--- {where} ({b['lang']}) at {time.monotonic() - t:.1f}s" + (f", run {k + 1}" if k else ""), flush=True)
        if k:  # a run again starts in a folder of its own (what earlier runs wrote stays theirs), files copied in
            os.chdir(home)
            os.makedirs(f"rerun-{b['line']}-{k}", exist_ok=True)
            for f in files:
                shutil.copy(f, f"rerun-{b['line']}-{k}")
            os.chdir(f"rerun-{b['line']}-{k}")
        if b["lang"] == "python":
            code = compile("\n" * b["line"] + b["text"], where, "exec")
            try:
                exec(code, ns)
            except BaseException:
                traceback.print_exc()
                print(f"BLOCK FAILED: {where}", flush=True)
                sys.exit(1)
        else:
            rc = subprocess.run(["bash", "-euo", "pipefail", "-c", b["text"]]).returncode
            if rc:
                print(f"BLOCK FAILED: {where} (bash exit {rc})", flush=True)
                sys.exit(1)
    os.chdir(home)
"""


def _runnable(path: Path, *, slow: bool = False) -> list[Block]:
    skip = {"fragment"} if slow else {"fragment", "slow"}
    return [b for b in blocks(path) if b.lang in RUN and b.mark not in skip]


def _run_page(
    path: Path, tmp_path: Path, run: list[Block], *, repeat: dict[int, int] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``run`` in order in one fresh process (``repeat``: block line -> how many times it runs)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.log", "_ext", "api"))
    spec = tmp_path / ".blocks.json"
    spec.write_text(
        json.dumps([{**b.__dict__, "repeat": (repeat or {}).get(b.line, 1)} for b in run]), encoding="utf-8"
    )
    driver = tmp_path / ".driver.py"
    driver.write_text(_DRIVER, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run(
        [sys.executable, str(driver), str(spec)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    failed = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BLOCK FAILED")), "")
    assert proc.returncode == 0, f"{failed or path.name}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


_PAGES = [p for p in pages() if _runnable(p)]
_SLOW_PAGES = [p for p in pages() if len(_runnable(p, slow=True)) > len(_runnable(p))]


@pytest.mark.parametrize("path", _PAGES, ids=_ids(_PAGES))
def test_page_blocks_run(path: Path, tmp_path: Path) -> None:
    """Run the page's blocks (all but fragments and slow ones) in order in a fresh process; it must exit 0."""
    _run_page(path, tmp_path, _runnable(path))


@pytest.mark.slow
@pytest.mark.parametrize("path", _SLOW_PAGES, ids=_ids(_SLOW_PAGES))
def test_page_blocks_run_with_slow_ones(path: Path, tmp_path: Path) -> None:
    """The same, with the blocks marked slow."""
    _run_page(path, tmp_path, _runnable(path, slow=True))


# ---------------------------------------------------------------------------------------------- loops under load
LOOP_RUNS = 5
_LOOP = re.compile(r"while not \w+\.finished")
_NOT_AFTER_A_RUN = ("Traceback", "generate after shutdown", "rollout of")  # what a clean run never prints


def loop_prefix(path: Path) -> list[Block]:
    """The runnable blocks of ``path`` up to its last loop block: what the loops need, not the rest of the page."""
    runnable = _runnable(path)
    loops = loop_blocks(path)
    last = max(b.line for b in loops)
    return [b for b in runnable if b.line <= last and (b.lang == "python" or b in loops)]


def loop_blocks(path: Path) -> list[Block]:
    """The runnable blocks of ``path`` that run a training loop: a python block with one, or a bash block that runs
    a file block of the page with one."""
    runnable = _runnable(path)
    loop_files = {b.arg for b in blocks(path) if b.mark == "file" and _LOOP.search(b.text)}
    return [
        b
        for b in runnable
        if b.mark != "file"
        and (
            (b.lang == "python" and _LOOP.search(b.text)) or (b.lang == "bash" and any(f in b.text for f in loop_files))
        )
    ]


class CpuHogs:
    """``n`` busy processes for as long as the ``with`` block runs; by default one on every core but one (the run
    under test then shares the machine: its threads and processes wait for a core while the hogs spin; a hog on
    the last core too would only slow the suite down, the bugs show without it)."""

    def __init__(self, n: int | None = None) -> None:
        self.n = n or max(1, (os.cpu_count() or 2) - 1)
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuHogs:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(30)


_LOOP_PAGES = [p for p in pages() if loop_blocks(p)]


@pytest.mark.parametrize("path", _LOOP_PAGES, ids=_ids(_LOOP_PAGES))
def test_page_loops_run_five_times_under_load(path: Path, tmp_path: Path) -> None:
    """Every block of the page that runs a loop runs 5 times, with CPU hogs (every core but one) running the whole
    time: each run ends cleanly, and nothing prints a traceback or a failed rollout after it (a loop that stops the
    engine while rollouts are in flight must hand them back, not fail them)."""
    loops = loop_blocks(path)
    with CpuHogs():
        proc = _run_page(path, tmp_path, loop_prefix(path), repeat={b.line: LOOP_RUNS for b in loops})
    for b in loops:
        runs = sum(1 for ln in proc.stdout.splitlines() if ln.startswith(f"--- {b.page}:{b.line} "))
        assert runs == LOOP_RUNS, f"{b.page}:{b.line} ran {runs} times, not {LOOP_RUNS}"
    out = proc.stdout + proc.stderr
    bad = [ln for ln in out.splitlines() if any(word in ln for word in _NOT_AFTER_A_RUN)]
    assert not bad, f"{path.name}: printed under load\n" + "\n".join(bad[:20]) + f"\n{out[-4000:]}"
