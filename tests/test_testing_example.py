"""The documented third-party adapter example runs as a user would run it: its own conftest, the plugin's
fixtures (entry point), the --colo-fsm-profile option."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "third_party_adapter"


def test_third_party_adapter_example_passes():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--colo-fsm-profile",
            "colo-fsm-dev",
            str(EXAMPLE),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout, proc.stdout[-2000:]


def test_plugin_is_registered_by_entry_point():
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="pytest11") if e.name == "colo_fsm"]
    assert eps and eps[0].value == "colo_fsm.testing.pytest_plugin"


def test_default_adapters_fixture(colo_fsm_adapters, colo_fsm_machine, colo_fsm_settings):
    from colo_fsm.testing import Adapters, LifecycleMachine

    assert isinstance(colo_fsm_adapters(), Adapters)
    assert issubclass(colo_fsm_machine, LifecycleMachine)
    assert colo_fsm_settings.max_examples >= 50
