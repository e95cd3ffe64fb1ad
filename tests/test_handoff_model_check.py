"""bench/handoff_model_check.py: the model on each committed run's own graph-decode table, beside the run."""

from __future__ import annotations

import json

import pytest

from bench import gpu_runs
from bench import handoff_model as hm
from bench import handoff_model_check as check


@pytest.fixture(scope="module")
def rows():
    return check.check(hm.RUNS, set(gpu_runs.HEADLINE_COMMITS))


def test_the_model_on_each_runs_own_table_is_nearer_the_run_wherever_the_tables_tell_apart(rows):
    """What the docs say of the check: the headline has five park ratios on the direct loop, with no race, from
    runs that timed the graph decode themselves (6bd92a8's three at 8,192, and the 32,768 park / sync of ca6c37b and
    fb85515). Where the run's own table and the default one give park ratios more than 0.05 apart, at 32,768, the
    run's own is the nearer (1.63 and 1.62 against 1.78, runs 1.662 and 1.625); at 8,192 the tables agree within
    0.01 (6bd92a8's table has one context, 832 tokens). The coordinator loop's and the lost race's pairs are shown,
    never counted."""
    got = {(r["file"].split("-h200-")[1][:-5], r["pair"]): r for r in rows}
    figures = {k: (round(r["run"], 3), round(r["own_table"], 2), round(r["default_table"], 2)) for k, r in got.items()}
    assert figures == {
        ("reasoning-cut8192-park-drain-b1df85d", "park/drain"): (1.267, 1.83, 1.72),
        ("reasoning-cut8192-park-drain-sync-abort-6bd92a8", "park/abort"): (1.139, 1.02, 1.01),
        ("reasoning-cut8192-park-drain-sync-abort-6bd92a8", "park/drain"): (1.727, 1.73, 1.72),
        ("reasoning-cut8192-park-drain-sync-abort-6bd92a8", "park/sync"): (1.729, 1.76, 1.75),
        ("reasoning-cut8192-coordinator-park-drain-sync-abort-dec9bed", "park/abort"): (0.949, 1.02, 1.01),
        ("reasoning-cut8192-coordinator-park-drain-sync-abort-dec9bed", "park/drain"): (1.365, 1.58, 1.72),
        ("reasoning-cut8192-coordinator-park-drain-sync-abort-dec9bed", "park/sync"): (1.691, 1.62, 1.75),
        ("reasoning-cut8192-coordinator-park-drain-sync-abort-collector-first-3c2b2f0", "park/abort"): (
            0.976,
            1.02,
            1.01,
        ),
        ("reasoning-cut8192-coordinator-park-drain-sync-abort-collector-first-3c2b2f0", "park/drain"): (
            1.605,
            1.69,
            1.72,
        ),
        ("reasoning-cut8192-coordinator-park-drain-sync-abort-collector-first-3c2b2f0", "park/sync"): (
            1.584,
            1.7,
            1.74,
        ),
        ("reasoning-cut32768-park-sync-graph-contexts-ca6c37b", "park/sync"): (1.662, 1.63, 1.78),
        ("reasoning-cut32768-park-sync-graph-contexts-fb85515", "park/sync"): (1.625, 1.62, 1.78),
    }
    counted = [r for r in rows if not r["note"]]
    assert len(counted) == 5 and all(r["engine"] == "direct" for r in counted)
    apart = [r for r in counted if r["apart"]]
    assert [r["cut"] for r in apart] == [32768, 32768] and all(r["own_nearer"] for r in apart)
    assert all(r["remark"] == check.ONE_CONTEXT for r in counted if "6bd92a8" in r["file"])
    b1df85d = got[("reasoning-cut8192-park-drain-b1df85d", "park/drain")]
    assert b1df85d["note"] == check.RACE  # its drain's second handoff found nothing in flight
    assert all(r["note"].startswith(check.COORDINATOR) for r in rows if r["engine"] == "coordinator")


def test_a_drain_lost_its_race_where_a_handoff_found_nothing_or_an_older_runs_step_made_nothing():
    assert gpu_runs.drain_lost_its_race({"groups_in_flight_at_handoff": [32, 0, 32]})
    assert not gpu_runs.drain_lost_its_race({"groups_in_flight_at_handoff": [32, 32, 32]})
    assert gpu_runs.drain_lost_its_race({"step_samples_per_s": {"min": 0.0}})
    assert not gpu_runs.drain_lost_its_race({"step_samples_per_s": {"min": 4.2}})


def test_the_command_prints_and_writes_its_rows_and_refuses_what_gives_none(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert check.main(["--smoke", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "handoff_model_check" and data["rows"] and len({r["file"] for r in data["rows"]}) == 1
    assert "a model, not a measurement" in capsys.readouterr().out
    for argv, said in (
        (["--commits", ""], "--commits"),
        (["--commits", "0000000"], "no run of --commits 0000000"),
        (["--workload", str(tmp_path / "none.json")], "--workload"),
    ):
        with pytest.raises(SystemExit):
            check.main([*argv, "--out", str(out)])
        assert said in capsys.readouterr().err, argv


def test_the_model_runs_at_the_runs_own_warm_up_and_buffer_order_where_its_json_records_them_or_not(monkeypatch):
    """A run at ``max_age`` 4 with 4 warm-up steps that records no ``warmup_steps`` (as the oldest JSON do) is
    modelled after its shape's 4 warm-up steps, as one that records them, not after 1; the run's buffer order is the
    model's too (the model's start and deadline orders agree at the committed points, so the order is read where the
    model takes it)."""
    shape, baseline, seed = hm.load_workload(hm.WORKLOAD)
    d = json.loads((hm.RUNS / "2026-12-04-h200-reasoning-cut32768-park-sync-graph-contexts-fb85515.json").read_text())
    d["shape"] |= {"max_trajectory_age_steps": 4, "warmup": 4}

    def ratio(run: dict) -> float:
        rate = check.model_rates(run, ["park", "sync"], baseline, shape, seed)
        return rate["park"] / rate["sync"]

    recorded = ratio({**d, "warmup_steps": {"park": 4, "sync": 0}})
    after_one = ratio({**d, "warmup_steps": {"park": 1, "sync": 0}})
    unrecorded = {k: v for k, v in d.items() if k != "warmup_steps"}
    assert ratio(unrecorded) == recorded != pytest.approx(after_one)
    orders = []
    run_mode = hm.run_mode
    monkeypatch.setattr(
        hm, "run_mode", lambda mode, s, *a, **kw: orders.append(s.buffer_order) or run_mode(mode, s, *a, **kw)
    )
    d["shape"]["buffer_order"] = "deadline"
    ratio(d)
    assert orders == ["deadline", "deadline"]


def test_a_commit_named_that_gives_no_row_is_refused_not_skipped(tmp_path, capsys):
    with pytest.raises(SystemExit):
        check.main(["--commits", "fb85515,0000000", "--out", str(tmp_path / "check.json")])
    assert "--commits fb85515,0000000: no run of 0000000" in capsys.readouterr().err


def test_a_park_over_drain_hold_ratio_is_read_as_its_mode_not_skipped_for_its_key(tmp_path):
    """The JSON spells park / ``drain-hold`` ``ratio_park_over_drain_hold``: the check models ``drain-hold`` for it
    (and skips the CPU-time and per-round ratios beside it)."""
    name = "2026-12-04-h200-reasoning-cut32768-park-sync-graph-contexts-fb85515.json"
    d = json.loads((hm.RUNS / name).read_text())
    d["modes"]["drain-hold"] = d["modes"]["sync"]
    d |= {"ratio_park_over_drain_hold": 1.5, "ratio_park_over_drain_hold_cpu": 1.4}
    (tmp_path / name).write_text(json.dumps(d))
    got = check.check(tmp_path, {"fb85515"})
    assert [(r["pair"], r["run"]) for r in got] == [("park/drain-hold", 1.5), ("park/sync", d["ratio_park_over_sync"])]
