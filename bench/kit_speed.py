#!/usr/bin/env python
"""How fast and how short the testing kit is for a user, measured as a user runs it (issue 27's bars).

It writes a small user project into a temporary folder: the docs' own toy adapters (the ``toy_adapters.py``
block of docs/embedding.md, as the page writes it), a ``conftest.py`` with the one fixture, and four tests (the
shipped order through the fixture, NeMo-RL's order, four thread ranks, the TestCase class), then runs pytest on
it, as the user would, under the default profile (``colo-fsm-ci``):

* ``four tests``: the four tests of honest adapters;
* ``lying engine``: the first test with a ``ToyEngine`` whose ``suspend()`` returns and keeps serving (planted in
  the project, not in colo-fsm), and how many lines pytest prints for the failure;
* ``broken spec``: one test of a spec variant whose last validation resumes collection (the checker refuses it).

    PYTHONPATH=. .venv/bin/python bench/kit_speed.py [--json PATH]

Each line says the load average (1 min) before and after its run, and the CPU seconds pytest used: on a shared
2-core machine the wall-clock times move with the load, the CPU seconds much less (the kit runs on one core).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from tests.test_docs_blocks import blocks  # noqa: E402  (the page's own block reader)

CONFTEST = '''
import os

import pytest

from colo_fsm.testing import RecordingCollector
from colo_fsm.testing.fakes import Journal
from toy_adapters import ToyEngine, ToyModel, ToyTrainer


class LyingToyEngine(ToyEngine):
    """The planted bug: suspend() returns (the engine says it is suspended) and decode keeps going."""

    def suspend(self) -> None:
        pass


def make_toy_adapters(handle):
    model = ToyModel()
    engine_class = LyingToyEngine if os.environ.get("KIT_SPEED_PLANT") else ToyEngine
    engine = engine_class(model, weight_version=lambda: handle.lifecycle.weight_version)
    return engine, ToyTrainer(model), RecordingCollector(Journal())


@pytest.fixture
def colo_fsm_adapters():
    return make_toy_adapters
'''

TESTS = '''
import dataclasses

from colo_fsm.states import NEMO_RL, Fact, State
from colo_fsm.testing import check_lifecycle, lifecycle_test_case
from conftest import make_toy_adapters


def test_shipped_order(colo_fsm_check_lifecycle):
    colo_fsm_check_lifecycle()


def test_nemo_rl_order():
    check_lifecycle(make_toy_adapters, spec=NEMO_RL)


def test_four_ranks(colo_fsm_check_ranks):
    result = colo_fsm_check_ranks(4)
    assert result.ok, result.report()


TestToyAdapters = lifecycle_test_case(make_toy_adapters)


def test_my_spec_variant():
    """A variant whose last validation resumes collection: Concluding -> Done dropped, Concluding -> Generating
    taken whenever the step does not save (the static rules accept it; the exhaustive checker does not)."""
    def edit(t):
        if (t.trigger, t.source, t.dest) == ("conclude", State.CONCLUDING, State.GENERATING):
            return dataclasses.replace(t, unless=(Fact.SAVE_THIS_STEP,))
        return t

    ts = tuple(edit(t) for t in NEMO_RL.transitions if (t.trigger, t.source, t.dest) != ("conclude", State.CONCLUDING, State.DONE))
    check_lifecycle(make_toy_adapters, spec=dataclasses.replace(NEMO_RL, name="my_variant", transitions=ts))
'''


def write_project(folder: Path) -> None:
    """The user's project: the docs' toy adapters, the conftest, the tests."""
    (block,) = [b for b in blocks(ROOT / "docs" / "embedding.md") if b.mark == "file" and b.arg == "toy_adapters.py"]
    (folder / "toy_adapters.py").write_text(block.text, encoding="utf-8")
    (folder / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (folder / "test_lifecycle.py").write_text(TESTS, encoding="utf-8")


def run(folder: Path, select: list[str], *, plant: bool = False) -> dict[str, object]:
    """pytest on the project (default profile); seconds, outcome line, failure section lines, load before/after."""
    env = {k: v for k, v in os.environ.items() if k != "COLO_FSM_HYPOTHESIS_PROFILE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(folder)])
    if plant:
        env["KIT_SPEED_PLANT"] = "1"
    load0 = os.getloadavg()[0]
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *select],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime
    out = proc.stdout
    summary = out.strip().splitlines()[-1] if out.strip() else proc.stderr[-300:]
    failure = re.search(r"^_{3,} .* _{3,}$(.*?)(?=^(?:_{3,} |={3,} ))", out, re.S | re.M)
    return {
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "summary": summary,
        "failure_lines": len(failure.group(1).strip("\n").splitlines()) if failure else 0,
        "failure": failure.group(1).strip("\n") if failure else "",
        "load_before": round(load0, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--show", action="store_true", help="print the lying engine's failure as pytest shows it")
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="colo-fsm-kit-speed-") as tmp:
        folder = Path(tmp)
        write_project(folder)
        four = ["test_lifecycle.py", "-k", "not my_spec_variant"]
        results["four tests"] = run(folder, four)
        results["lying engine"] = run(folder, ["test_lifecycle.py::test_shipped_order"], plant=True)
        results["broken spec"] = run(folder, ["test_lifecycle.py::test_my_spec_variant"])
    for name, r in results.items():
        print(
            f"{name:<13} {r['seconds']:>6} s ({r['cpu_seconds']} s CPU)   load {r['load_before']} -> {r['load_after']}   "
            f"failure: {r['failure_lines']} lines   {r['summary']}"
        )
    if args.show:
        print(results["lying engine"]["failure"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"provenance": prov, **results}, indent=2) + "\n", encoding="utf-8")
    ok = (
        "4 passed" in str(results["four tests"]["summary"])
        and "1 failed" in str(results["lying engine"]["summary"])
        and "1 failed" in str(results["broken spec"]["summary"])
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
