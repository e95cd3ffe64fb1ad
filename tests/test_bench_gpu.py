"""The GPU evidence runner (``python -m bench.gpu``) on the CPU: stages as child processes under their budgets,
resumable across calls, skipped with a reason when the machine lacks GPUs or time, one bundle per call; and the
performance page regenerated from JSON alone."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpu, gpu_report, gpu_runs  # noqa: E402

WRITE_JSON = (
    "-c",
    "import json, sys; json.dump({'ratio_park_over_sync': 1.5, 'no_ratio': {'park_over_drain': 'drain has 1'}},"
    " open(sys.argv[1] + '/out.json', 'w'))",
    "{out}",
)


def _use_stages(monkeypatch, fake: tuple) -> tuple:
    """Run ``fake`` in place of the real stages, with this interpreter, on a machine of one GPU."""
    monkeypatch.setattr(gpu, "STAGES", fake)
    monkeypatch.setattr(gpu, "BY_NAME", {s.name: s for s in fake})
    monkeypatch.setattr(gpu, "PY", sys.executable)
    monkeypatch.setattr(gpu, "gpu_count", lambda: 1)
    return fake


@pytest.fixture
def stages(monkeypatch):
    """Three quick stages in place of the real ones: one writes JSON, one needs two GPUs, one fails."""
    fake = (
        gpu.Stage("writes", "writes a JSON", WRITE_JSON, 60, smoke=()),
        gpu.Stage("two-gpus", "needs two GPUs", ("-c", "pass"), 60, gpus=2),
        gpu.Stage("fails", "exits 3", ("-c", "raise SystemExit(3)"), 60, smoke=()),
    )
    return _use_stages(monkeypatch, fake)


def test_stages_run_once_skip_what_cannot_run_and_resume_where_they_stopped(tmp_path, stages, capsys):
    out, tgz = tmp_path / "out", tmp_path / "out.tgz"
    assert gpu.run(["--out", str(out), "--bundle", str(tgz)]) == 1  # "fails" fails: the call says so
    state = json.loads((out / "stages.json").read_text())
    assert state["writes"]["rc"] == 0 and state["writes"]["outputs"] == ["writes/out.json"]
    assert state["two-gpus"] == {"skipped": "needs 2 GPUs, this machine has 1"}
    assert state["fails"]["rc"] == 3
    summary = capsys.readouterr().out
    assert "park_over_sync=1.50" in summary and "no park_over_drain: drain has 1" in summary
    with tarfile.open(tgz) as tar:
        assert "out/writes/out.json" in tar.getnames() and "out/stages.json" in tar.getnames()
    (out / "writes" / "out.json").unlink()
    gpu.run(["--out", str(out), "--stages", "writes,fails"])  # the next call: only what is not done
    assert "writes: done in an earlier call" in capsys.readouterr().out
    assert not (out / "writes" / "out.json").exists()
    gpu.run(["--out", str(out), "--stages", "writes", "--redo"])
    assert (out / "writes" / "out.json").exists()


def _writes_rounds(rounds: int, done: int, rc: int) -> tuple[str, ...]:
    """A stage's argv that writes a bench JSON with ``rounds_done`` of ``rounds`` and then exits ``rc``."""
    record = json.dumps({"rounds": rounds, "rounds_done": done})
    code = f"import json, sys; json.dump({record}, open(sys.argv[1] + '/out.json', 'w')); raise SystemExit({rc})"
    return ("-c", code, "{out}")


def test_the_stages_file_tells_a_json_written_whole_from_one_cut_short(tmp_path, monkeypatch, capsys):
    """A stage stopped after its last write (rc 124 from its cap as it exits) is recorded with its JSON whole; one
    whose JSON did not reach its last round is recorded cut short, whatever its rc; JSON that counts no rounds is
    not judged."""
    _use_stages(
        monkeypatch,
        (
            gpu.Stage("whole-then-cut", "writes every round, then exits 124", _writes_rounds(2, 2, 124), 60, smoke=()),
            gpu.Stage("cut-short", "writes one round of two, exits 0", _writes_rounds(2, 1, 0), 60, smoke=()),
            gpu.Stage("no-rounds", "writes a JSON without rounds", WRITE_JSON, 60, smoke=()),
        ),
    )
    out = tmp_path / "out"
    gpu.run(["--out", str(out)])
    state = json.loads((out / "stages.json").read_text())
    assert state["whole-then-cut"]["rc"] == 124 and state["whole-then-cut"]["whole"] == {
        "whole-then-cut/out.json": True
    }
    assert state["cut-short"]["rc"] == 0 and state["cut-short"]["whole"] == {"cut-short/out.json": False}
    assert state["no-rounds"]["whole"] == {}
    printed = capsys.readouterr().out
    assert "=== whole-then-cut: rc=124 in" in printed and "; its JSON whole" in printed
    assert "; JSON cut short: cut-short/out.json" in printed
    (out / "cut-short" / "out.json").write_text("{not json")
    assert gpu.whole(out / "cut-short" / "out.json") is False


def test_a_stage_that_cannot_finish_in_what_is_left_is_not_started(tmp_path, stages, capsys):
    gpu.run(["--out", str(tmp_path), "--stages", "writes", "--budget-s", "10"])
    assert "writes: not started (10 s left" in capsys.readouterr().out
    assert "writes" not in json.loads((tmp_path / "stages.json").read_text())


def test_no_gpu_no_run_unless_smoke_and_unknown_stages_are_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu, "gpu_count", lambda: 0)
    assert gpu.run(["--out", str(tmp_path)]) == 0 and "no CUDA device" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu.run(["--stages", "reasoning-9k"])
    assert "unknown ['reasoning-9k']" in capsys.readouterr().err


def test_every_real_stage_is_named_for_its_job_and_has_a_cpu_twin_where_one_gpu_suffices():
    for s in gpu.STAGES:
        assert s.name == s.name.lower() and "round" not in s.name and "batch" not in s.name
        assert s.timeout_s <= 600 or s.long, f"{s.name}: one remote call runs at most 10 minutes (else long=True)"
        gpu_only = s.name.startswith("colocated-vs-dedicated") or s.name in ("resident-vs-rebuild", "memory-peak")
        if s.gpus == 1 and not gpu_only:
            assert s.smoke is not None, f"{s.name} has no CPU twin"
    assert gpu.main(["--list"]) == 0


def _handoff_json(path: Path, modes: dict, **top) -> None:
    row = {
        "samples_per_s": 7.0,
        "trained_samples_per_s": 6.8,
        "measured_steps": 3,
        "step_samples_per_s": {"median": 7.0, "min": 6.5, "max": 7.6, "n": 3},
        "draining_share": 0.01,
        "handoff_p50_ms": 14.0,
        "engine_decode_tokens_per_s": 11000.0,
        "mean_running_requests": 150.0,
    }
    data = {
        "benchmark": "inflight_handoff",
        "model": "gpt200m",
        "commit": "abc1234",
        "date": "2026-12-02T01:00:00+00:00",
        "command": "python3 bench/inflight_handoff.py ...",
        "machine": {"device": "NVIDIA H200"},
        "min_steps_for_a_ratio": 3,
        "rounds": 1,
        "rounds_done": 1,
        "shape": {"max_tokens": 8192, "max_trajectory_age_steps": 2, "steps": 3},
        "modes": {m: {**row, **v} for m, v in modes.items()},
        **top,
    }
    path.write_text(json.dumps(data))


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="0"
skipped="1" tests="3" time="12.5" timestamp="2026-12-02T01:20:11"><testcase classname="tests.test_a" name="test_one"
/><testcase classname="tests.test_a" name="test_two" /><testcase classname="tests.test_b" name="test_te"><skipped
message="needs Transformer Engine" /></testcase></testsuite></testsuites>"""


def test_the_performance_page_is_the_json_and_nothing_else(tmp_path):
    """Files found by content (any name); park over three runs: the median and every run; a mode cut short is
    shown and left out of the median; each ratio as its JSON gives it, or why there is none; the newest commit's
    runs are the headline and an older commit's are history (its one-step ratio shown as not a ratio)."""
    _handoff_json(
        tmp_path / "2026-12-02-h200-park-drain.json",
        {"park": {"samples_per_s": 8.0}, "drain": {"samples_per_s": 5.0, "trained_samples_per_s": 3.0}},
        ratio_park_over_drain=1.6,
        ratio_park_over_drain_cpu=1.5,
    )
    _handoff_json(
        tmp_path / "2026-12-02-h200-park-sync.json",
        {"park": {"samples_per_s": 7.0}, "sync": {"samples_per_s": 4.0, "measured_steps": 1}},
        no_ratio={"park_over_sync": "sync has 1 measured step(s), fewer than 3"},
        rounds_done=0,
        date="2026-12-02T02:00:00+00:00",
    )
    _handoff_json(
        tmp_path / "2026-12-02-h200-sync-park.json",
        {"park": {"samples_per_s": 7.5}, "sync": {"samples_per_s": 5.0}},
        ratio_park_over_sync=1.5,
    )
    _handoff_json(  # an older commit, a one-step ratio computed before the 3-step rule
        tmp_path / "2026-12-01-h200-old.json",
        {"park": {"samples_per_s": 10.8, "measured_steps": 1}, "sync": {"samples_per_s": 4.3, "measured_steps": 1}},
        commit="0ld0000",
        date="2026-12-01T15:00:00+00:00",
        ratio_park_over_sync=2.51,
    )
    (tmp_path / "2026-12-02-h200-pytest-gpu.xml").write_text(JUNIT)
    (tmp_path / "notes.md").write_text("#### Notes by hand\n")
    page = tmp_path / "PERFORMANCE.md"
    argv = ["report", str(tmp_path), "--out", str(page), "--plot", str(tmp_path / "map.png")]
    assert gpu.main([*argv, "--notes", str(tmp_path / "notes.md")]) == 0
    text = page.read_text()
    head, history = text.split("## History")
    assert "Headline: commit `abc1234`" in head and "0ld0000" not in head and "10.80" not in head
    assert "| park | 7.50 | 8.00 (3); 7.50 (3); 7.00 (3) | 9 | 6.50-7.60 |" in head  # the median and each run
    assert "| sync | 5.00 | 5.00 (3); 4.00 (1 of 3, the run ended first; not in the median) | 3 |" in head
    assert "park_over_drain **1.600**" in head and "park_over_sync **1.500**" in head and "_cpu" not in head
    assert "no park_over_sync: sync has 1 measured step(s)" in head
    assert "| drain | 5.00 | 3.00 | " in head  # samples made and trained per second, side by side
    assert "**2 passed, 0 failed, 1 skipped**" in head and "**skipped**: needs Transformer Engine" in head
    assert head.index("Notes by hand") > head.index("Ratios")
    assert "commit `0ld0000`" in history and "| park | 10.80 |" in history
    assert "park_over_sync 2.51 as this JSON computed it (park has 1, sync has 1 measured step(s)" in history
    assert (tmp_path / "map.png").stat().st_size > 0 and "![where parking pays: samples/s per mode](map.png)" in text
    commit, now, old = gpu_runs.split_history(gpu_runs.load(tmp_path)[0])
    assert commit == "abc1234" and len(now[("gpt200m", 8192, 2)]) == 3 and len(old[("gpt200m", 8192, 2)]) == 1
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    _handoff_json(cpu / "inflight_handoff_reasoning_smoke.json", {"park": {}}, machine={"device": "cpu"})
    assert gpu_runs.load(cpu)[0] == {}  # a CPU smoke run is no GPU figure
    assert list(gpu_runs.load(cpu, include_cpu=True)[0]) == [("gpt200m", 8192, 2)]
    _handoff_json(tmp_path / "coordinator.json", {"park": {"samples_per_s": 9.0}}, engine="coordinator")
    runs = gpu_runs.load(tmp_path)[0]  # the coordinator's run is its own workload, never in the direct median
    assert [d["modes"]["park"]["samples_per_s"] for d in runs[("gpt200m on the coordinator loop", 8192, 2)]] == [9.0]
    assert all(d.get("engine", "direct") == "direct" for d in runs[("gpt200m", 8192, 2)])
    h100 = {"device": "NVIDIA H100 80GB HBM3"}
    _handoff_json(tmp_path / "h100.json", {"park": {"samples_per_s": 8.0}}, machine=h100)
    runs = gpu_runs.load(tmp_path)[0]  # a run on another card than the page's is its own workload too
    assert [d["modes"]["park"]["samples_per_s"] for d in runs[("gpt200m, on an NVIDIA H100 80GB HBM3", 8192, 2)]] == [
        8.0
    ]
    assert all("H100" not in str(d.get("machine")) for d in runs[("gpt200m", 8192, 2)])


def test_a_window_that_filled_its_buffer_is_no_steady_state_on_the_page(tmp_path):
    """An older JSON whose drain made far more than it trained (its buffer filling) computed a ratio before the
    steady-state rule: the page shows it as not a ratio and leaves drain out of the median; named commits form
    the headline together."""
    _handoff_json(
        tmp_path / "old.json",
        {
            "park": {"fresh_samples": 792, "trained_samples": 768},
            "drain": {"fresh_samples": 1280, "trained_samples": 768},
        },
        ratio_park_over_drain=1.33,
        commit="1111111",
    )
    _handoff_json(tmp_path / "new.json", {"park": {"fresh_samples": 800, "trained_samples": 768}}, commit="2222222")
    page = tmp_path / "PERFORMANCE.md"
    assert gpu.main(["report", str(tmp_path), "--out", str(page), "--commits", "1111111,2222222"]) == 0
    text = page.read_text()
    assert "Headline: commits `1111111, 2222222`" in text and "## History" not in text
    assert "| drain | - | 7.00 (3; not steady: not in the median) | 0 |" in text
    assert (
        "park_over_drain 1.33 as this JSON computed it (drain made 1,280 and trained 768 in its window (+67%)" in text
    )
    assert "| park | 7.00 | 7.00 (3); 7.00 (3) | 6 |" in text  # park's windows were steady (+3%, +4%)


def test_the_report_reads_the_committed_gpu_runs():
    """The committed folder: the headline is the runs at 6bd92a8, 791d078 and b1df85d (the same measured code):
    four at the 8,192 cut (park in three, drain in three, sync and abort in two; one park beside the graph
    baseline from the workload's context) and two at 32,768 with park, drain and sync; every other run, the
    32,768 cut at b2de103 among them, is history."""
    commits = ("6bd92a8", "791d078", "b1df85d")
    commit, now, old = gpu_runs.split_history(gpu_runs.load(ROOT / "docs" / "gpu-runs")[0], commits)
    assert commit == "6bd92a8, 791d078, b1df85d" and set(now) == {("gpt200m", 8192, 2), ("gpt200m", 32768, 2)}
    runs = now[("gpt200m", 8192, 2)]
    assert len(runs) == 4
    for mode, n in (("park", 3), ("drain", 3), ("sync", 2), ("abort", 2)):
        assert sum(mode in d["modes"] for d in runs) == n, mode
    assert any("ratio_park_decode_over_graph_decode_matched_context" in d for d in runs)
    long = now[("gpt200m", 32768, 2)]
    assert len(long) == 2
    for d in long:
        assert all(d["modes"][m]["measured_steps"] >= 3 for m in ("park", "drain", "sync"))
        assert {"ratio_park_over_drain", "ratio_park_over_sync"} <= set(d)
    assert all(d.get("commit") not in commits for rs in old.values() for d in rs)
    assert ("gpt200m", 32768, 2) in old


def test_the_committed_coordinator_runs_back_the_readmes_faster_path_figures():
    """The coordinator path's runs at 4366d6d, a workload of their own: one process with all four modes at 3
    measured steps and the ratios at top level, one with park beside the graph decode (its drain cut at 2 steps:
    no ratio). The README's figures for the faster path are these JSON's, to the digits it quotes."""
    commits = ("6bd92a8", "791d078", "b1df85d", "4366d6d")
    _, now, _ = gpu_runs.split_history(gpu_runs.load(ROOT / "docs" / "gpu-runs")[0], commits)
    runs = now[("gpt200m on the coordinator loop", 8192, 2)]
    assert len(runs) == 2 and {d["commit"] for d in runs} == {"4366d6d"}
    (whole,) = [d for d in runs if set(d["modes"]) == {"park", "drain", "sync", "abort"} and "graph_decode" not in d]
    (beside,) = [d for d in runs if "graph_decode" in d]
    assert all(whole["modes"][m]["measured_steps"] >= 3 for m in whole["modes"])
    assert beside["modes"]["park"]["measured_steps"] >= 3 and beside["modes"]["drain"]["measured_steps"] < 3
    assert "park_over_drain" in beside["no_ratio"] and "ratio_park_over_drain" not in beside
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for key in ("ratio_park_over_drain", "ratio_park_over_sync", "ratio_park_over_abort"):
        assert f"**{whole[key]:.3f}**" in readme, key
    decode = beside["ratio_park_decode_over_graph_decode_matched_context"]
    assert decode >= 0.8 and f"**{decode:.3f}**" in readme
    for mode in ("park", "drain", "sync", "abort"):
        assert f"{whole['modes'][mode]['samples_per_s']:.2f}" in readme, mode


def test_the_report_shows_the_engine_paths_with_their_commit_steps_handoff_and_decode():
    """The committed engine-path run (aaf3a49: park on both paths, 3 measured steps each) on the page: its commit
    (read from the engines' runs, which older JSON keeps only there), both step counts, the handoff and the decode
    rate of each path."""
    paths = gpu_runs.load(ROOT / "docs" / "gpu-runs")[1]
    (line,) = [x for x in gpu_report.engine_paths_section(paths) if "engine-paths-reasoning-cut8192-park" in x]
    assert "commit `aaf3a49`" in line
    text = "\n".join(gpu_report.engine_paths_section(paths))
    assert "park: coordinator 8.98 vs direct 8.05 samples/s (**1.11x**, 3 and 3 measured steps)" in text
    assert "handoff p50 80.2 vs 11.3 ms; engine decode 12,689 vs 11,220 tokens/s" in text
    assert "checked for a pause" not in line  # it predates the setting: megatron's 20, unsaid as every run's then
    ((path, d),) = [(p, d) for p, d in paths if "engine-paths-reasoning-cut8192-park" in p.name]
    newer = {**d, "runs": {**d["runs"], "coordinator": {**d["runs"]["coordinator"], "ep_consensus_interval": 1}}}
    (said,) = [x for x in gpu_report.engine_paths_section([(path, newer)]) if path.name in x]
    assert said.endswith("; the coordinator loop checked for a pause every 1 step(s)")


def test_the_report_shows_each_runs_graph_baseline_and_each_modes_decode_steps():
    """Both baselines of a run (its context and the workload's), batch by batch, and each mode's decode-only graph
    steps from its profile; a run without a baseline or a profile adds no row."""
    park = {
        "samples_per_s": 8.0,
        "measured_steps": 3,
        "engine_step_profile_per_round": [
            {"decode_graph": {"steps": 8062, "share": 0.984, "ms_per_step": 9.54, "mean_active": 113.2}}
        ],
    }
    rows = [{"batch": 64, "step_ms": 4.1, "decode_tokens_per_s": 15599.0}, {"batch": 128, "step_ms": 6.6,
            "decode_tokens_per_s": 19389.0}]  # fmt: skip
    matched = [{"batch": 128, "step_ms": 9.78, "decode_tokens_per_s": 13086.0}]
    with_base = {
        "_file": "a.json",
        "modes": {"park": park, "drain": {"samples_per_s": 4.6, "measured_steps": 3}},
        "graph_decode": {"rows": rows, "context_tokens": 832, "rows_matched_context": matched,
                         "matched_context_tokens": 1417,
                         "rows_by_context": [{"context_tokens": 16384, "rows": [{"batch": 64, "step_ms": 12.5,
                                                                                 "decode_tokens_per_s": 5120.0}]},
                                             {"context_tokens": 30000, "rows": [], "error": "TokenOverflowError"},
                                             {"context_tokens": 40000, "rows": [],
                                              "error": "not run: the context 30,000 failed before it"}]},
    }  # fmt: skip
    text = "\n".join(gpu_report.decode_lines([with_base, {"_file": "b.json", "modes": {}}]))
    assert "| run | context (tokens) | batch 64 | batch 128 |" in text
    assert "| `a.json` | 832 | 4.10 (15,599) | 6.60 (19,389) |" in text
    assert "| `a.json` | 1,417 | - | 9.78 (13,086) |" in text
    assert "| `a.json` | 16,384 | 12.50 (5,120) | - |" in text  # a --graph-contexts row; batch 128 did not fit
    assert "* `a.json`: from 30,000 tokens: failed, TokenOverflowError" in text  # never dropped unsaid
    assert "* `a.json`: from 40,000 tokens: not run: the context 30,000 failed before it" in text
    assert "| `a.json` | park | 8,062 | 0.984 | 9.54 | 113 |" in text
    assert "drain" not in text and "b.json" not in text
    assert gpu_report.decode_lines([{"_file": "b.json", "modes": {}}]) == []


def test_the_report_shows_which_captured_graph_each_modes_steps_ran_where_the_profile_counts_them():
    """A profile that counts decode-graph steps per captured graph adds a row per mode, largest share first, with
    the requests each graph's steps decoded; profiles without the count add no such table."""
    graphs = {
        "64": {"steps": 200, "share": 0.25, "ms_per_step": 7.0, "mean_ran": 40.0},
        "128": {"steps": 600, "share": 0.75, "ms_per_step": 10.5, "mean_ran": 66.0},
    }
    prof = {"decode_graph": {"steps": 800, "share": 0.9, "ms_per_step": 9.6, "mean_active": 60.0, "graphs": graphs}}
    run = {"_file": "g.json", "modes": {"park": {"samples_per_s": 8.0, "measured_steps": 3,
                                                 "engine_step_profile_per_round": [prof]}}}  # fmt: skip
    text = "\n".join(gpu_report.decode_lines([run]))
    assert "| `g.json` | park | 128: 75% 10.5 ms 66 decoded, 64: 25% 7.0 ms 40 decoded |" in text
    del prof["decode_graph"]["graphs"]
    assert "captured graph each ran" not in "\n".join(gpu_report.decode_lines([run]))


def test_a_long_stage_runs_only_detached_and_a_detached_runner_is_followed(tmp_path, stages, monkeypatch, capsys):
    long = gpu.Stage("long", "longer than a call", WRITE_JSON, 3600, smoke=(), long=True)
    monkeypatch.setattr(gpu, "BY_NAME", {**gpu.BY_NAME, "long": long})
    monkeypatch.delenv("COLO_FSM_GPU_DETACHED", raising=False)
    gpu.run(["--out", str(tmp_path), "--stages", "long"])
    assert "start it with --detach" in capsys.readouterr().out
    assert gpu.run(["--out", str(tmp_path / "none"), "--wait", "0"]) == 2  # nothing was detached there
    (tmp_path / "runner.pid").write_text("999999999")  # a runner that is gone
    (tmp_path / "runner.log").write_text("=== long: rc=0\n")
    assert gpu.run(["--out", str(tmp_path), "--wait", "5", "--bundle", str(tmp_path / "b.tgz")]) == 0
    assert "finished" in capsys.readouterr().out and (tmp_path / "b.tgz").exists()


def test_the_report_names_both_graph_baselines_and_refuses_both_below_the_step_rule():
    """Park's decode against the baseline's rows and against its matched-context rows: one line each, with the rate
    and batch it was compared with (the matched one with its context); from a park of too few steps, neither."""
    park = {"samples_per_s": 8.0, "measured_steps": 3, "fresh_samples": 800, "trained_samples": 768}
    d = {
        "_file": "run.json",
        "modes": {"park": park},
        "graph_decode": {"matched_context_tokens": 1417},
        "graph_decode_tokens_per_s": 19389.0,
        "graph_decode_batch": 128,
        "graph_decode_matched_context_tokens_per_s": 12000.0,
        "graph_decode_matched_context_batch": 128,
        "ratio_park_decode_over_graph_decode": 0.577,
        "ratio_park_decode_over_graph_decode_matched_context": 0.932,
    }
    line = gpu_report.ratio_lines(d)
    assert "park_decode_over_graph_decode **0.577** (park's engine decode against the pure CUDA-graph decode, " in line
    assert "19,389 tokens/s at batch 128)" in line
    assert "**0.932** (park's engine decode against the pure CUDA-graph decode from the workload's mean" in line
    assert "(1417 tokens), 12,000 tokens/s at batch 128)" in line
    park["measured_steps"] = 2
    line = gpu_report.ratio_lines(d)
    assert line.count("below the 3-step rule") == 2 and "**" not in line


def test_the_page_shows_the_groups_each_handoff_found_in_flight(tmp_path):
    """Drain's figure depends on how many of its handoffs found nothing to wait for: each run's row says what each
    handoff found, and a run that did not record it shows '-', not an empty list or a zero."""
    _handoff_json(
        tmp_path / "run.json",
        {"park": {"groups_in_flight_at_handoff": [61, 60, 62]}, "drain": {"groups_in_flight_at_handoff": [0, 33, 35]}},
    )
    _handoff_json(tmp_path / "older.json", {"drain": {}}, commit="0ld0000", date="2026-12-01T01:00:00+00:00")
    page = tmp_path / "PERFORMANCE.md"
    assert gpu.main(["report", str(tmp_path), "--out", str(page), "--commits", "abc1234,0ld0000"]) == 0
    text = page.read_text()
    assert "groups in flight at each handoff" in text
    assert "| 14 ms | 61, 60, 62 | 11,000 |" in text and "| 14 ms | 0, 33, 35 | 11,000 |" in text
    assert "| 14 ms | - | 11,000 |" in text  # the older run


def test_every_handoff_stages_cpu_twin_parses_as_the_bench_reads_it():
    """Each stage that runs the handoff bench has a CPU twin whose options the bench accepts (a later option wins:
    the CPU shape, the direct engine, megatron's default graph sizing), so ``--smoke`` rehearses every GPU
    command; a stage whose twin would be refused fails here, not on the device."""
    from bench import gpu_stages, inflight_handoff

    handoff = [s for s in gpu_stages.STAGES if s.argv[:1] == ("bench/inflight_handoff.py",)]
    assert len(handoff) > 20
    for stage in handoff:
        assert stage.smoke is not None, stage.name
        argv = [a.replace("{out}", "/tmp/twin") for a in (*stage.argv[1:], *stage.smoke)]
        args, *_ = inflight_handoff.parse_args(argv)
        assert args.device == "cpu" and args.graph_sizing is None, stage.name
