"""``bench/run_all.py --repeat``: several runs of a benchmark, each figure as its median with quartiles and range
(a figure from one run on a shared machine is one draw, not evidence). The runs here are a stand-in script whose figures are
known in advance, so every number checked is exact; nothing is timed."""

from __future__ import annotations

import json

import pytest

from bench import _spread, run_all

FAKE_BENCH = """
import json, sys
from pathlib import Path

HEADLINE = {"the ratio": "rows.1.ratio", "the wall": "wall_s"}


def main(argv=None):
    counter = Path(sys.argv[1])
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    out = {"rows": [{"ratio": 0.0}, {"ratio": [1.0, 5.0, 2.0, 4.0][n - 1]}], "wall_s": 10.0 * n, "ok": True}
    Path(sys.argv[2]).write_text(json.dumps(out))
    return 1 if n == 2 else 0  # run 2 misses its target: its figures still count


if __name__ == "__main__":
    sys.exit(main())
"""


def test_spread_of_known_values() -> None:
    s = _spread.spread([4.0, 1.0, 3.0, 10.0])  # the median, not the mean (4.5)
    assert (s["median"], s["min"], s["max"], s["n"]) == (3.5, 1.0, 10.0, 4)
    assert (s["p25"], s["p75"]) == (2.5, 5.5)
    assert _spread.spread([7.0])["p25"] == _spread.spread([7.0])["p75"] == 7.0


def test_every_number_is_summarized_by_its_path() -> None:
    runs = [
        {"a.json": {"x": {"y": 1}, "rows": [{"r": 2.0}], "flag": True, "name": "n"}},
        {"a.json": {"x": {"y": 3}, "rows": [{"r": 4.0}], "flag": False, "name": "n"}, "b.json": {"z": 1}},
    ]
    summary = _spread.summarize(runs)
    assert set(summary["a.json"]) == {"x.y", "rows.0.r"}  # booleans and strings are no figures
    assert summary["a.json"]["x.y"]["median"] == 2.0
    assert summary["b.json"]["z"]["n"] == 1
    assert _spread.lookup(summary, "rows.0.r")["values"] == [2.0, 4.0]  # type: ignore[index]
    assert _spread.lookup(summary, "b.json:z")["median"] == 1.0  # type: ignore[index]
    assert _spread.lookup(summary, "nowhere") is None


def test_every_declared_headline_is_a_literal_of_figure_paths() -> None:
    declared = {p.stem: _spread.declared_headline(p) for p in run_all.discover()}
    for stem in ("transition_overhead", "fingerprint_barrier", "decode_bookkeeping", "server_pressure"):
        assert declared[stem], f"bench/{stem}.py declares no HEADLINE"
    for stem, headline in declared.items():
        for label, path in headline.items():
            assert path and " " not in path, (stem, label, path)


def test_repeat_runs_keep_each_json_and_report_the_spread(tmp_path, monkeypatch, capsys) -> None:
    script = tmp_path / "fake_bench.py"
    script.write_text(FAKE_BENCH)
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(run_all, "discover", lambda: [script])
    monkeypatch.setattr(run_all, "RESULTS", results)
    argv = ["--repeat", "4", "--figure", "rows.0.ratio", "--", str(tmp_path / "count"), str(results / "fake.json")]
    assert run_all.main(argv) == 1  # one run missed its target
    table = capsys.readouterr().out
    assert "| fake_bench | the ratio | 3 | 1.75-4.25 | 1-5 | 4 |" in table, table
    assert "| fake_bench | the wall | 25 | 17.5-32.5 | 10-40 | 4 |" in table, table
    assert "| fake_bench | rows.0.ratio | 0 | 0-0 | 0-0 | 4 |" in table, table
    spread = json.loads((results / "repeat" / "fake_bench" / "spread.json").read_text())
    assert spread["status"] == ["ok", "exit 1", "ok", "ok"]
    assert spread["figures"]["fake.json"]["rows.1.ratio"]["values"] == [1.0, 5.0, 2.0, 4.0]
    assert len(spread["loadavg_1min_before_after"]) == 4
    for i in range(1, 5):
        assert (results / "repeat" / "fake_bench" / f"run{i}" / "fake.json").is_file()


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_repeat_must_be_positive(bad: str) -> None:
    with pytest.raises(SystemExit):
        run_all.main(["--repeat", bad, "--list"])
