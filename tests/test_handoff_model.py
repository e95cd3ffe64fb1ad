"""bench/handoff_model.py: colo-fsm's own admission in virtual time, checked against the committed H200 runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench import gpu
from bench import handoff_model as hm
from colo_fsm.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "docs" / "gpu-runs"
MEASURED = {  # the committed runs the model is held to: (cut, file)
    8192: "2026-12-02-h200-reasoning-cut8192-park-drain-sync-abort-6bd92a8.json",
    32768: "2026-12-02-h200-reasoning-cut32768-park-drain-sync-791d078.json",
}


@pytest.fixture(scope="module")
def workload():
    shape, table, seed = hm.load_workload(hm.WORKLOAD)
    return shape, hm.Timing(table), seed


@pytest.mark.parametrize("cut", sorted(MEASURED))
def test_the_model_decodes_as_many_requests_as_the_gpu_did_in_each_mode(workload, cut):
    """Requests decoding per step and drain's waiting share, mode by mode, within 15% of the H200 run (the rates
    within 15% too): the admission the model runs is colo-fsm's own, so a change to it moves these."""
    shape, timing, seed = workload
    data = json.loads((RUNS / MEASURED[cut]).read_text())
    s = replace(shape, max_tokens=cut, max_trajectory_age_steps=2)
    for mode in ("park", "drain", "sync"):
        row = data["modes"][mode]
        gpu_active = row["engine_step_profile_per_round"][0]["decode_graph"]["mean_active"]
        r = hm.run_mode(mode, s, timing, seed=seed, warmup=1, steps=3)
        assert r.mean_decoding == pytest.approx(gpu_active, rel=0.15), (mode, r.mean_decoding, gpu_active)
        assert r.samples_per_s == pytest.approx(row["samples_per_s"], rel=0.15), (mode, r.samples_per_s)
        assert r.waiting_share == pytest.approx(row["draining_share"], abs=0.05), mode
        assert abs(r.buffer_growth) <= hm.MAX_BUFFER_GROWTH, mode


def test_at_max_age_4_one_warm_up_step_leaves_parks_window_unsteady_and_four_do_not(workload):
    """Why the age-4 stages warm up 4 steps: with one, park's bench window trains far more than it makes."""
    shape, timing, seed = workload
    s = replace(shape, max_tokens=8192, max_trajectory_age_steps=4)
    one = hm.run_mode("park", s, timing, seed=seed, warmup=1, steps=3)
    four = hm.run_mode("park", s, timing, seed=seed, warmup=4, steps=3)
    assert one.buffer_growth < -hm.MAX_BUFFER_GROWTH
    assert abs(four.buffer_growth) <= hm.MAX_BUFFER_GROWTH
    for name in ("reasoning-8k-age4", "reasoning-32k-age4"):
        argv = gpu.BY_NAME[name].argv
        assert argv[argv.index("--warmup") + 1] == "4" and argv[argv.index("--max-age") + 1] == "4", name


def test_a_long_run_gives_every_window_of_three_steps(workload):
    shape, timing, seed = workload
    s = replace(shape, max_tokens=2048, num_prompts_per_step=4, max_active_requests=32)
    r = hm.run_mode("park", s, timing, seed=seed, warmup=1, steps=6)
    rates = r.window_rates(3)
    assert len(rates) == 4 and min(rates) <= r.samples_per_s <= max(rates)
    assert rates[0] == pytest.approx(sum(r.made_per_step[:3]) / sum(r.step_s[:3]))
    assert sum(r.made_per_step) == r.made and r.trained == 6 * 4 * shape.samples_per_group


def test_the_step_time_is_the_table_between_its_rows_plus_the_host_cost():
    t = hm.Timing([(64, 6.0), (16, 3.0)], host_ms=1.0)
    assert t.step_s(16) == pytest.approx(0.004) and t.step_s(64) == pytest.approx(0.007)
    assert t.step_s(40) == pytest.approx((3.0 + 3.0 * 24 / 48 + 1.0) / 1000)
    assert t.step_s(128) == pytest.approx((6.0 + 3.0 * 64 / 48 + 1.0) / 1000)  # the last rows' line, extended
    for bad, field in (({"table": []}, "table"), ({"table": [(0, 1.0)]}, "table"), ({"host_ms": -1}, "host_ms")):
        with pytest.raises(ConfigError, match=field):
            hm.Timing(**{"table": [(16, 3.0)], **bad})
    with pytest.raises(ConfigError, match="mode"):
        hm.run_mode("abort", None, t, seed=0, warmup=1, steps=3)  # type: ignore[arg-type]


def test_the_command_runs_its_smoke_point_and_refuses_bad_options(tmp_path, capsys):
    out = tmp_path / "model.json"
    assert hm.main(["--smoke", "--steps", "4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["note"].startswith("a model, not a measurement") and len(data["points"]) == 1
    point = data["points"][0]
    assert set(point["modes"]) == {"park", "drain", "sync"} and "model_park_over_sync" in point
    assert "a model, not a measurement" in capsys.readouterr().out
    for argv, said in (
        (["--modes", "park,abort"], "--modes"),
        (["--cut", "8k"], "--cut"),
        (["--age", "0"], "--age"),
        (["--order", "random"], "--order"),
        (["--steps", "2", "--window", "3"], "--steps"),
        (["--workload", str(tmp_path / "none.json")], "--workload"),
    ):
        with pytest.raises(SystemExit):
            hm.main([*argv, "--out", str(out)])
        assert said in capsys.readouterr().err, argv
