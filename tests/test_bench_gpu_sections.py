"""The GPU benches' own checks, run on the CPU: a bench whose section fails exits 1 with the others kept (so
its stage fails loudly, where a printed line once passed as rc 0), and the park probe runs a KV mode that
colo-fsm refuses to park with CUDA graphs eager, saying why, rather than failing on the refusal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _gpu as g  # noqa: E402
from bench import park_probe  # noqa: E402


def test_a_failed_section_fails_the_bench_and_keeps_the_sections_before_it(tmp_path, capsys):
    out = tmp_path / "park_probe.json"
    rc = park_probe.main(["--device", "cpu", "--skip-decode", "--modes", "persist,nonsense", "--out", str(out)])
    data = json.loads(out.read_text())
    assert rc == 1, "a failed section must fail the bench"
    assert list(data["errors"]) == ["park/nonsense"] and "kv_cache_mode" in data["errors"]["park/nonsense"]["error"]
    assert data["sections"]["park/persist"]["pass"] is True  # the section before it is kept whole
    assert "FAILED sections: park/nonsense" in capsys.readouterr().err
    assert g.failed_sections({"errors": {}}) == 0 and g.failed_sections({}) == 0


def test_the_park_probe_asks_colo_fsm_which_modes_park_with_graphs():
    args = park_probe.argparse.Namespace(num_cuda_graphs=16)
    refused = park_probe.graphs_refused("offload", args)
    assert refused is not None and "kv_cache_mode" in refused and "offload" in refused
    assert park_probe.graphs_refused("persist", args) is None and park_probe.graphs_refused("recompute", args) is None
