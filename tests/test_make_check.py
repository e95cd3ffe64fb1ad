"""``make check``, the everyday loop: lint and the default suite without the modules marked ``heavy``. Its list
(``tests/conftest.py``) names modules that exist, and the quick loop and ``make test`` select what they say."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from conftest import HEAVY

ROOT = Path(__file__).resolve().parent.parent


def _recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    m = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.MULTILINE)
    assert m, f"no {target} target in the Makefile"
    return m.group(0)


def test_every_heavy_module_exists() -> None:
    present = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    assert HEAVY <= present, sorted(HEAVY - present)


def test_check_is_lint_and_the_suite_without_heavy_modules() -> None:
    check = _recipe("check")
    assert check.startswith("check: lint")
    assert '-m "not slow and not gpu and not heavy"' in check
    assert "nemo-gym" not in check  # the quick loop needs no second venv


def test_make_test_runs_the_heavy_modules_too() -> None:
    test = _recipe("test")
    assert '-m "not slow and not gpu"' in test and "heavy" not in test
    assert "-j2 setup nemo-gym-venv" in test  # both venvs built side by side


def test_loadgroup_keeps_a_module_on_one_worker() -> None:
    """``make test``'s ``-n 2 --dist loadgroup`` schedules by tests/conftest.py's groups: every test of a module runs
    on one worker (its module fixtures built once; the Ray modules share one worker and one cluster), here two
    quick modules of many tests each, which plain load scheduling spreads over both workers."""
    modules = ["tests/test_make_check.py", "tests/test_rules.py"]
    args = ["-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-k", "not loadgroup", *modules]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for m in re.finditer(r"^\[(gw\d+)\] .*?PASSED (tests/\w+\.py)::", out.stdout, re.MULTILINE):
        workers[m.group(2)].add(m.group(1))
    assert set(workers) == set(modules), out.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
