"""lifecycle_machine.py is split by job (issue 29 item 2): every name users import from it still imports from it
(the same object as in its new module), colo_fsm.testing exports what it did, and no module of the package is
over 800 lines."""

from __future__ import annotations

import importlib
from pathlib import Path

import colo_fsm
import colo_fsm.testing as testing

lm = importlib.import_module("colo_fsm.testing.lifecycle_machine")  # the package's attribute of that name is a function

PUBLIC = (
    "FAULT_PATIENCE",
    "STATS",
    "AdapterFactory",
    "Adapters",
    "KitHandle",
    "LifecycleMachine",
    "RanksResult",
    "RunConfig",
    "StepRecord",
    "as_adapters",
    "build_components",
    "callable_targets",
    "check_lifecycle",
    "exercise_ranks",
    "lifecycle_machine",
    "lifecycle_test_case",
    "recording_fakes",
    "run_configs",
    "spec_fakes",
    "stats_snapshot",
)
"""``colo_fsm.testing.lifecycle_machine.__all__`` before the split."""

TESTING = (
    "CI_PROFILE",
    "DEEP_PROFILE",
    "DEV_PROFILE",
    "SCENARIOS",
    "Adapters",
    "CheckResult",
    "FakeClock",
    "FakeReplayBuffer",
    "FakeRequestSource",
    "Journal",
    "KitHandle",
    "LifecycleMachine",
    "RecordingCollector",
    "RecordingDrain",
    "RecordingEngine",
    "RecordingTrainer",
    "StepPlan",
    "check",
    "check_all",
    "check_lifecycle",
    "exercise_ranks",
    "lifecycle_machine",
    "lifecycle_settings",
    "lifecycle_test_case",
    "recording_adapters",
    "recording_fakes",
    "spec_fakes",
)
"""``colo_fsm.testing.__all__`` before the split."""

MAX_LINES = 800


def test_every_public_name_still_imports_from_lifecycle_machine():
    missing = [name for name in PUBLIC if not hasattr(lm, name)]
    assert not missing, f"colo_fsm.testing.lifecycle_machine lost {missing}"
    assert set(PUBLIC) <= set(lm.__all__)
    moved = {name: getattr(lm, name).__module__ for name in PUBLIC if hasattr(getattr(lm, name), "__module__")}
    assert moved["Adapters"] == "colo_fsm.testing.components" and moved["exercise_ranks"] == "colo_fsm.testing.ranks"


def test_colo_fsm_testing_exports_what_it_did():
    missing = [name for name in TESTING if not hasattr(testing, name)]
    assert not missing and set(TESTING) <= set(testing.__all__), missing


def test_no_module_of_the_package_is_over_800_lines():
    root = Path(colo_fsm.__file__).resolve().parent
    sizes = {str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines()) for p in root.rglob("*.py")}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
