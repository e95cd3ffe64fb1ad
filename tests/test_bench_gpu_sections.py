"""The GPU benches' own checks, run on the CPU: a bench whose section fails exits 1 with the others kept (so
its stage fails loudly, where a printed line once passed as rc 0), and the park probe runs a KV mode that
colo-fsm refuses to park with CUDA graphs eager, saying why, rather than failing on the refusal. The probe runs
as its own process, as its stage runs it (a bench sets the process's logging and distributed state)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _gpu as g  # noqa: E402
from bench import park_probe  # noqa: E402


def _probe(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "park_probe.json"
    cmd = [sys.executable, "bench/park_probe.py", "--device", "cpu", "--skip-decode", "--out", str(out), *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    return done, json.loads(out.read_text())


def test_a_failed_section_fails_the_bench_and_keeps_the_sections_before_it(tmp_path):
    done, data = _probe(tmp_path, "--modes", "persist,nonsense")
    assert done.returncode == 1, ("a failed section must fail the bench", done.stdout[-2000:], done.stderr[-2000:])
    assert list(data["errors"]) == ["park/nonsense"] and "kv_cache_mode" in data["errors"]["park/nonsense"]["error"]
    assert data["sections"]["park/persist"]["pass"] is True  # the section before it is kept whole
    assert "FAILED sections: park/nonsense" in done.stderr
    assert g.failed_sections({"errors": {}}) == 0 and g.failed_sections({}) == 0


def test_the_park_probe_asks_colo_fsm_which_modes_park_with_graphs():
    args = park_probe.argparse.Namespace(num_cuda_graphs=16)
    refused = park_probe.graphs_refused("offload", args)
    assert refused is not None and "kv_cache_mode" in refused and "offload" in refused
    assert park_probe.graphs_refused("persist", args) is None and park_probe.graphs_refused("recompute", args) is None


def test_a_probe_that_parks_nothing_fails_its_section(tmp_path):
    """A park section whose requests all finished before the suspend (nothing parked, nothing spanning the
    handoff) measured no park: it fails, and so does the bench, though nothing raised inside the probe."""
    done, data = _probe(tmp_path, "--modes", "persist", "--park-after", "100000")
    assert done.returncode == 1 and "parked at the suspend 0" in data["errors"]["park/persist"]["error"]
    assert data["sections"]["park/persist"]["pass"] is False  # what it measured is kept


def test_a_refusal_other_than_the_modes_is_raised_not_taken_for_eager():
    import pytest

    from colo_fsm.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        park_probe.graphs_refused("persist", park_probe.argparse.Namespace(num_cuda_graphs=0))
    assert err.value.field == "num_cuda_graphs"
    with pytest.raises(ConfigError) as err:
        park_probe.graphs_refused("nonsense", park_probe.argparse.Namespace(num_cuda_graphs=16))
    assert err.value.field == "kv_cache_mode"
