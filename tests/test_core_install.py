"""The bare core: ``pip install colo-fsm`` with no extras, in a fresh venv, installs ``transitions`` and nothing
heavy, and a whole lifecycle runs there (no torch, no hypothesis, no Ray, no FastAPI, no matplotlib).

The sources are copied to a tmp folder first (an in-tree build would write ``build/`` into the repository). pip
resolves from its cache and the configured indexes; with build isolation the build backend (setuptools) comes
from there too (about 20 s on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
from importlib.metadata import distributions
from importlib.util import find_spec

import colo_fsm
from colo_fsm import CheckpointDecision, Lifecycle, LifecycleConfig, State, ValidationDecision
from colo_fsm.testing.checker import check
from colo_fsm.testing.fakes import recording_adapters

j, e, t, c, d = recording_adapters(urls=["http://127.0.0.1:1/v1"])
lc = Lifecycle(e, t, c, config=LifecycleConfig(num_steps=4), drain=d, checkpoint=CheckpointDecision(2),
               validation=ValidationDecision(3), validator=lambda step, wv: {"acc": 1.0})
lc.start()
while not lc.finished:
    lc.step([0, 1])
final = lc.stop()
try:
    from colo_fsm.testing import lifecycle_test_case  # noqa: F401
    machine_error = None
except ModuleNotFoundError as exc:
    machine_error = str(exc)
print(json.dumps({
    "final": final.value, "weight_version": lc.weight_version,     "checker_ok": check(2).ok, "version": colo_fsm.__version__, "machine_error": machine_error,
    "heavy": {m: find_spec(m) is not None for m in ("torch", "hypothesis", "ray", "fastapi", "matplotlib", "megatron")},
    "installed": sorted(d.metadata["Name"].lower() for d in distributions()),
}))
"""


USER_TEST = r"""
import sys

from colo_fsm import Lifecycle, LifecycleConfig, State
from colo_fsm.testing.fakes import recording_adapters


def test_a_lifecycle_under_pytest_without_torch_or_hypothesis():
    assert "torch" not in sys.modules and "hypothesis" not in sys.modules
    j, e, t, c, d = recording_adapters()
    lc = Lifecycle(e, t, c, config=LifecycleConfig(num_steps=2), drain=d)
    lc.start()
    while not lc.finished:
        lc.step([0])
    assert lc.stop() is State.STOPPED


def test_the_machine_fixture_says_what_to_install(colo_fsm_check_lifecycle):
    colo_fsm_check_lifecycle()
"""


def _env() -> dict[str, str]:
    """The environment without PYTHONPATH (which would import the repository, not the installed package)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("core")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "colo_fsm", src / "colo_fsm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=_env())
    py = venv / "bin" / "python"
    done = subprocess.run(  # -v: the build backend's own output (its warnings) shows only then
        [str(py), "-m", "pip", "install", "-v", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (tmp / "install.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    return py


def _setuptools_warnings(log: str) -> list[str]:
    """Lines where setuptools warns or informs (``...Warning:``, ``InformationOnly:``; pip 25+ shows both as
    ``BuildBackendWarning``)."""
    return [
        line.strip()
        for line in log.splitlines()
        if "setuptools" in line.lower() and ("Warning" in line or "InformationOnly" in line)
    ]


def test_the_install_prints_no_setuptools_warning(core_venv: Path) -> None:
    """The package's metadata is what setuptools asks for (the SPDX license string): its build warns of nothing."""
    log = (core_venv.parents[2] / "install.log").read_text(encoding="utf-8")
    assert "Building" in log or "Running command" in log, log[-2000:]  # the backend's output was captured
    assert not _setuptools_warnings(log), "\n".join(_setuptools_warnings(log))


def test_the_editable_install_prints_no_setuptools_notice(core_venv: Path, tmp_path: Path) -> None:
    """``make setup`` installs the package editable: setuptools says nothing there either (its notice about folders
    that shadow the package comes with its import finder, which the declared flat layout does not need)."""
    src = core_venv.parents[2] / "src"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=_env())
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-v", "--no-deps", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, "-e", str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "editable" in log.lower(), log[-2000:]  # the backend's output was captured
    assert not _setuptools_warnings(log), "\n".join(_setuptools_warnings(log))


def test_bare_core_installs_transitions_only_and_runs_a_lifecycle(core_venv: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [str(core_venv), "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env()
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["heavy"] == dict.fromkeys(res["heavy"], False), res["heavy"]
    assert set(res["installed"]) - {"pip", "setuptools"} == {"colo-fsm", "transitions", "six"}, res["installed"]
    assert res["final"] == State_STOPPED and res["weight_version"] == 4 and res["checker_ok"]
    assert res["version"] == "0.1.0" or res["version"][0].isdigit()
    assert "pip install 'colo-fsm[testing]'" in (res["machine_error"] or ""), res["machine_error"]


def test_the_pytest_plugin_loads_in_a_core_install(core_venv: Path, tmp_path: Path) -> None:
    """With pytest but no hypothesis, the ``colo_fsm`` pytest11 plugin loads; its machine fixtures say what to install."""
    pip = [str(core_venv), "-m", "pip", "install", "-q", "--disable-pip-version-check", "pytest==9.2.0"]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stderr[-2000:]
    (tmp_path / "test_user.py").write_text(USER_TEST, encoding="utf-8")
    out = subprocess.run(
        [str(core_venv), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_env(),
    )
    text = out.stdout + out.stderr
    assert "1 passed" in text and ("1 failed" in text or "1 error" in text), text[-3000:]
    assert "needs hypothesis: pip install 'colo-fsm[testing]'" in text, text[-3000:]


State_STOPPED = "Stopped"
