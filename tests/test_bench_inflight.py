"""The reasoning bench's code path on the CPU in seconds (so it cannot rot): every mode, the per-mode budget,
the JSON written after every mode (a cut run keeps its data), and the side-by-side ratios."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpu_runs, inflight_handoff  # noqa: E402
from bench._handoff import add_ratios, ratio_name, ratio_refusal  # noqa: E402


@pytest.fixture(autouse=True)
def _logger_levels_restored():
    """The bench's ``main`` quiets colo-fsm's loggers for its table: run in-process here, it must not leave them
    quiet for the tests that follow (their ``caplog`` would see nothing)."""
    import logging

    names = ("", "colo_fsm", "megatron", "torch", "transitions")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)


def test_reasoning_smoke_writes_every_mode_and_the_ratios_on_one_engine(tmp_path, monkeypatch):
    from colo_fsm.adapters.megatron.engine import MegatronEngine

    builds = []
    real_bring_up = MegatronEngine.bring_up
    monkeypatch.setattr(MegatronEngine, "bring_up", lambda self: (builds.append(1), real_bring_up(self))[1])
    out = tmp_path / "inflight_handoff_reasoning_smoke.json"
    modes = ",".join((*inflight_handoff.DEFAULT_MODES, "drain-hold"))  # drain-hold runs only when named
    argv = ["--workload", "reasoning", "--smoke", "--steps", "3", "--modes", modes, "--out", str(out)]
    assert inflight_handoff.main(argv) == 0
    assert builds == [1], "every mode must run on the one engine the process built"
    data = json.loads(out.read_text())
    assert data["rig"]["build_s"] >= 0 and data["min_steps_for_a_ratio"] == 3
    assert data["workload"] == "reasoning" and data["shape"]["samples_per_group"] == 2
    for mode in ("park", "drain", "sync"):
        row = data["modes"][mode]
        assert row["samples_per_s"] > 0 and row["decode_tokens_per_s"] > 0 and row["samples_per_cpu_s"] > 0
        assert not row["cut_by_budget"] and row["loadavg"] and 0 < row["cpu_share"]
        assert row["measured_steps"] == 3 and row["step_samples_per_s"]["n"] == 3
        assert row["buffer_growth"] == pytest.approx(
            (row["fresh_samples"] - row["trained_samples"]) / row["trained_samples"]
        )
    assert data["modes"]["sync"]["warmup_steps"] == 0
    # every mode's measured steps train the same prompts: sync draws from where the others' warm-up ends
    per_step, warmup = data["shape"]["num_prompts_per_step"], data["shape"]["warmup"]
    first, window = warmup * per_step, [warmup * per_step, (warmup + 3) * per_step - 1]
    assert data["first_prompt"] == {m: (first if m == "sync" else 0) for m in data["modes"]} and first > 0
    for mode in data["modes"]:
        assert data["modes"][mode]["trained_prompts"] == window, mode
    for mode in ("park", "drain", "abort", "drain-hold"):  # each handoff's rollouts in flight, as it began
        held = data["modes"][mode]["groups_in_flight_at_handoff"]
        assert len(held) == 3 and all(isinstance(n, int) and n >= 0 for n in held), (mode, held)
        assert data["modes"][mode]["handoffs_with_nothing_in_flight"] == held.count(0)
    assert "groups_in_flight_at_handoff" not in data["modes"]["sync"]  # no collector: nothing to hold across
    assert data["modes"]["park"]["warmup_steps"] == data["modes"]["drain"]["warmup_steps"] == 1
    abort = data["modes"]["abort"]
    assert abort["samples_per_s"] > 0 and abort["inflight_stats"]["ended"] >= 0
    for other in ("sync", "drain", "drain-hold"):
        # A ratio where both windows were steady (|made - trained| within a fifth of trained), else why not: which
        # of the two a smoke run gets depends on the CPU's load (a busy machine's window can make a step more than
        # it trains), never on the bench's rule, which holds either way.
        park, row = data["modes"]["park"], data["modes"][other]
        why = ratio_refusal("park", park) or ratio_refusal(other, row)
        if why is None:
            assert data[f"ratio_{ratio_name(other)}"] == pytest.approx(park["samples_per_s"] / row["samples_per_s"])
        else:
            assert f"ratio_{ratio_name(other)}" not in data and data["no_ratio"][ratio_name(other)] == why, why
    assert data["modes"]["drain-hold"]["warmup_steps"] == 1 and "starts a rollout only" in data["drain_hold_admission"]
    assert "drain-hold" not in inflight_handoff.DEFAULT_MODES
    assert inflight_handoff.policy_of("drain-hold") == "drain" and inflight_handoff.policy_of("park") == "park"


def test_collector_first_holds_every_drain_handoff_until_the_collector_has_admitted(tmp_path, monkeypatch):
    """``--drain-race collector-first`` forces one outcome of drain's race after each resume. The interleaving is
    forced here the other way round too: every turn of the collector's admission is slowed (a hook before its
    ``_try_start``), so in the free race the trainer's handoff comes first and drains nothing (this setup gave
    handoffs finding 0, 0 and 4 groups). Forced, every measured handoff waits for the admission and finds the
    groups the collector admitted, and the row says how long each waited."""
    import time

    from colo_fsm.collector import AsyncCollector

    real = AsyncCollector._try_start

    def slow_admission(self):
        time.sleep(0.05)
        return real(self)

    monkeypatch.setattr(AsyncCollector, "_try_start", slow_admission)
    out = tmp_path / "forced.json"
    argv = ["--workload", "reasoning", "--smoke", "--modes", "drain", "--drain-race", "collector-first"]
    assert inflight_handoff.main([*argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    drain = data["modes"]["drain"]
    assert data["drain_race"] == "collector-first" and drain["measured_steps"] == 3
    assert all(n > 0 for n in drain["groups_in_flight_at_handoff"]), drain["groups_in_flight_at_handoff"]
    waits = drain["collector_first_waits_s"]
    assert len(waits) == 3 and all(w is not None and w > 0 for w in waits), waits


def test_the_admission_wait_reads_the_buffers_window_and_gives_up_on_a_failed_collector():
    """What ``wait_for_admission`` waits for, as the bench calls it (right after a batch was sampled): the
    buffer's window taken, exactly when ``reserve`` refuses the next place, or the collector's cap reached; a
    collector that failed ends the wait at once, with None."""
    from types import SimpleNamespace

    from bench._handoff import wait_for_admission, window_taken
    from colo_fsm.adapters.protocols import Completion
    from colo_fsm.collector import ReplayBuffer, TrajectoryGroup

    def group(pid: str) -> TrajectoryGroup:
        return TrajectoryGroup(pid, pid, (Completion(pid, (1,), 0),), (1.0,), 0)

    buf = ReplayBuffer(2, 2)  # a window of 6 groups
    for pid in ("a", "b"):
        assert buf.put(group(pid), ticket=buf.reserve(0))
    assert len(buf.sample(0, timeout=1)) == 2  # the step's batch in hand, as before a handoff
    for _ in range(3):
        assert buf.reserve(0) is not None and not window_taken(buf)
    assert buf.reserve(0) is not None and window_taken(buf) and buf.reserve(0) is None
    idle = SimpleNamespace(in_flight=0, cap=4, error=None)
    assert wait_for_admission(buf, idle) is not None
    empty = ReplayBuffer(2, 2)
    assert not window_taken(empty)
    assert wait_for_admission(empty, SimpleNamespace(in_flight=4, cap=4, error=None)) is not None  # the cap
    failed = SimpleNamespace(in_flight=0, cap=4, error=RuntimeError("rollout failed"))
    assert wait_for_admission(empty, failed) is None
    assert wait_for_admission(empty, SimpleNamespace(in_flight=0, cap=4, error=None), timeout_s=0.01) is None


def test_a_drain_whose_forced_race_gave_up_at_a_handoff_gets_no_ratio():
    """A handoff that went on without the collector's admission (its wait None) was not forced: the drain no
    longer measures what ``collector-first`` says, so it enters no ratio, and the reason names the count."""
    row = {"samples_per_s": 5.0, "measured_steps": 3, "fresh_samples": 768, "trained_samples": 768}
    assert ratio_refusal("drain", {**row, "collector_first_waits_s": [0.2, 0.0, 0.1]}) is None
    why = ratio_refusal("drain", {**row, "collector_first_waits_s": [0.2, None, 0.1]})
    assert why is not None and "1 of its 3 measured handoffs went on without the collector's admission" in why


def test_a_window_that_trained_what_it_did_not_make_is_said_to_empty_its_buffer():
    """A window that made fewer samples than it trained (it ate samples made before it) is refused as emptying its
    buffer, one that made more as filling it; the word follows the sign (a GPU run cut after two of abort's steps
    made 192 and trained 512)."""
    row = {"samples_per_s": 3.1, "measured_steps": 3, "fresh_samples": 192, "trained_samples": 512}
    emptying = ratio_refusal("abort", row)
    assert emptying is not None and "(-62%, more than 20%): its buffer was emptying" in emptying
    filling = ratio_refusal("drain", {**row, "fresh_samples": 1280, "trained_samples": 768})
    assert filling is not None and "(+67%, more than 20%): its buffer was filling" in filling
    assert gpu_runs.unsteady(row) == "made 192 and trained 512 in its window (-62%): its buffer was emptying"


def test_the_drain_race_option_needs_a_drain_to_force(capsys):
    with pytest.raises(SystemExit):
        inflight_handoff.main(
            ["--workload", "reasoning", "--smoke", "--modes", "park", "--drain-race", "collector-first"]
        )
    assert (
        "--drain-race collector-first forces drain's handoffs, and --modes park has no drain" in capsys.readouterr().err
    )


def test_graph_only_runs_no_mode_refuses_every_option_of_one_and_is_no_handoff_run(tmp_path, capsys):
    """``--graph-only``: the graph-decode baseline alone. Each option only the modes read is refused, as is
    ``--no-graph-baseline``, naming it (an option given as its default too), and on the GPU so is a run without CUDA graphs; on the CPU (no CUDA graphs)
    it says, and its JSON says, that the baseline did not run. Its benchmark is ``graph_decode`` with no ``modes``,
    so the performance page never counts it as a handoff run, and its default file is never a handoff run's."""
    base = ["--workload", "reasoning", "--smoke", "--graph-only"]
    for extra, named in (
        (["--modes", "park"], "--modes"),
        (["--steps", "3"], "--steps"),
        (["--warmup", "1"], "--warmup"),
        (["--rounds", "1"], "--rounds"),
        (["--mode-budget-s", "60"], "--mode-budget-s"),
        (["--engine", "coordinator"], "--engine"),
        (["--engine", "direct"], "--engine"),  # given, even as its default
        (["--drain-race", "collector-first"], "--drain-race"),
        (["--drain-race", "free"], "--drain-race"),
        (["--buffer-order", "start"], "--buffer-order"),
        (["--quick"], "--quick"),
        (["--max-age", "2"], "--max-age"),
        (["--num-prompts-per-step", "32"], "--num-prompts-per-step"),
        (["--temperature", "1.0"], "--temperature"),
        (["--micro-batch-tokens", "16384"], "--micro-batch-tokens"),
        (["--sample-timeout", "600"], "--sample-timeout"),
        (["--verbose"], "--verbose"),
        (["--no-graph-baseline"], "--no-graph-baseline"),
    ):
        with pytest.raises(SystemExit):
            inflight_handoff.main([*base, *extra])
        assert f"and {named}" in capsys.readouterr().err, extra
    # on the GPU it times the CUDA-graph decode: without graphs it would time nothing, so it is refused
    with pytest.raises(SystemExit):
        inflight_handoff.main(["--graph-only", "--device", "cuda"])
    assert "--graph-only on the GPU times the CUDA-graph decode: give --cuda-graphs" in capsys.readouterr().err
    assert Path(inflight_handoff.parse_args(base)[0].out).name == "graph_decode_reasoning_small_cut48_smoke.json"
    plain = inflight_handoff.parse_args(["--workload", "reasoning", "--smoke"])[0]
    assert (plain.engine, plain.drain_race) == ("direct", "free")  # the defaults, once read
    out = tmp_path / "graph.json"
    assert inflight_handoff.main([*base, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "graph_decode" and "modes" not in data and "graph_decode" not in data
    assert data["graph_decode_not_run"].startswith("the graph-decode baseline runs on a GPU")
    assert "graph-decode baseline: not run" in capsys.readouterr().out  # said, not only written
    assert not gpu_runs.is_handoff(out, data)


def test_a_drain_measured_while_its_buffer_fills_gets_no_ratio(tmp_path, capsys):
    """Without a warm-up, drain's first handoff finishes up to ``max_age`` steps of rollouts into an empty buffer:
    its window makes far more than it trains, which is no steady state, so no ratio is given (the GPU run at
    45b9528 quoted park / drain 1.33 from such a window: 1,280 made, 768 trained)."""
    out = tmp_path / "nowarm.json"
    argv = ["--workload", "reasoning", "--smoke", "--modes", "park,drain", "--steps", "3", "--warmup", "0"]
    assert inflight_handoff.main([*argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    drain = data["modes"]["drain"]
    assert drain["measured_steps"] == 3 and drain["buffer_growth"] > 0.2
    assert "ratio_park_over_drain" not in data
    drain_why = ratio_refusal("drain", drain)  # drain's own window is refused, whatever park's did
    assert drain_why is not None and drain_why.startswith(
        f"drain made {drain['fresh_samples']} samples and trained {drain['trained_samples']}"
    )
    assert "not in steady state" in drain_why
    # the page names the first mode refused: park's window too may fill without a warm-up on a loaded machine
    why = data["no_ratio"]["park_over_drain"]
    assert why in (ratio_refusal("park", data["modes"]["park"]), drain_why)
    assert f"no ratio_park_over_drain: {why}" in capsys.readouterr().out


def test_each_mode_records_the_engines_kinds_of_step_over_its_measured_window(tmp_path, monkeypatch, capsys):
    """On the GPU the dynamic engine keeps a step profile (colo_fsm/adapters/megatron/step_profile.py); the CPU
    backend keeps none, so a stand-in counts every decode step as one decode-on-graph step on the 16 graph: each
    mode's row then holds exactly its measured window's steps, not the warm-up's, with the graph each ran (printed
    too); the JSON says which graph sizing the run asked for (none here: megatron's default)."""
    from colo_fsm.adapters.megatron.engine import MegatronEngine

    def stand_in(self):
        n = self.steps
        g = {"steps": n, "wall_s": 0.002 * n, "ran": 3 * n, "ran_steps": n}
        return {"steps": n, "decode_graph/steps": n, "decode_graph/wall_s": 0.002 * n, "decode_graph/active": 3 * n,
                **{f"decode_graph/graph/16/{k}": v for k, v in g.items()}}  # fmt: skip

    monkeypatch.setattr(MegatronEngine, "step_profile", stand_in)
    out = tmp_path / "profile.json"
    argv = ["--workload", "reasoning", "--smoke", "--modes", "park,sync", "--steps", "3", "--out", str(out)]
    assert inflight_handoff.main(argv) == 0
    data = json.loads(out.read_text())
    for mode in ("park", "sync"):
        row = data["modes"][mode]
        (prof,) = row["engine_step_profile_per_round"]
        assert prof["steps"] > 0 and prof["steps"] == pytest.approx(row["decode_steps_per_s"] * row["measured_s"])
        assert prof["decode_graph"]["share"] == 1 and prof["decode_graph"]["mean_active"] == 3
        assert prof["decode_graph"]["ms_per_step"] == pytest.approx(2.0)
        assert prof["decode_graph"]["graphs"]["16"] == pytest.approx(
            {"steps": prof["steps"], "share": 1.0, "ms_per_step": 2.0, "mean_ran": 3.0}
        )
    assert data["cuda_graph_sizing"] is None
    assert "decode_graph 100% 2.0 ms 3 active (graphs 16: 100% 2.0 ms 3 decoded)" in capsys.readouterr().out


def test_the_mode_budget_stops_each_mode_after_its_first_measured_step_and_no_ratio_is_given(tmp_path, capsys):
    out = tmp_path / "budget.json"
    argv = ["--workload", "reasoning", "--smoke", "--modes", "park,sync", "--steps", "6", "--mode-budget-s", "1e-3"]
    assert inflight_handoff.main([*argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    for mode in ("park", "sync"):
        assert data["modes"][mode]["cut_by_budget"] and data["modes"][mode]["measured_steps"] == 1
    assert "ratio_park_over_sync" not in data  # one step each: an anecdote, not a ratio
    assert data["no_ratio"]["park_over_sync"] == "park has 1 measured step(s), fewer than 3"
    assert "no ratio_park_over_sync: park has 1 measured step(s)" in capsys.readouterr().out


def test_a_run_cut_after_the_first_mode_keeps_its_data(tmp_path, monkeypatch):
    out = tmp_path / "cut.json"
    real = inflight_handoff.run_mode

    def dies_in_drains_third_step(mode, rig, args, shape, on_step=None):
        steps = []

        def count(row):
            steps.append(row)
            on_step(row)
            if mode == "drain" and len(steps) == 2:
                raise KeyboardInterrupt("the device call's time limit")

        return real(mode, rig, args, shape, on_step=count)

    monkeypatch.setattr(inflight_handoff, "run_mode", dies_in_drains_third_step)
    with pytest.raises(KeyboardInterrupt):
        inflight_handoff.main(["--workload", "reasoning", "--smoke", "--modes", "park,drain", "--out", str(out)])
    assert out.exists(), "nothing written before the run was cut"
    data = json.loads(out.read_text())
    assert data["modes"]["park"]["samples_per_s"] > 0 and data["modes"]["park"]["measured_steps"] == 3
    assert data["modes"]["drain"]["measured_steps"] == 2  # the steps measured before the cut are kept
    assert "ratio_park_over_drain" not in data and "fewer than 3" in data["no_ratio"]["park_over_drain"]


def test_a_run_records_gits_commit_in_a_checkout_and_the_commit_file_only_in_a_copied_tree(tmp_path):
    """A ``COMMIT`` file left in a checkout goes stale with the next commit (a CPU run once recorded an older commit):
    in a checkout git's HEAD wins; the file names the commit only where there is no ``.git`` (the GPU machine's copy).
    """
    import subprocess

    from bench._provenance import git_commit

    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "COMMIT").write_text("abc1234\n", encoding="utf-8")
    assert git_commit(copy) == "abc1234"
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=checkout, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=checkout, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True, check=True
    ).stdout.strip()
    (checkout / "COMMIT").write_text("abc1234\n", encoding="utf-8")
    assert git_commit(checkout) == head != "abc1234"
    assert git_commit(tmp_path / "empty") is None


def test_ratios_compare_park_with_the_graph_decode_at_its_concurrency():
    row = {
        "samples_per_s": 2.0,
        "samples_per_cpu_s": 1.0,
        "decode_tokens_per_s": 900.0,
        "measured_steps": 3,
        "per_round_samples_per_s": [2.0],
    }
    out = {
        "modes": {
            "park": {**row, "samples_per_s": 6.0, "engine_decode_tokens_per_s": 14000.0, "mean_running_requests": 120},
            "sync": row,
            "abort": {"skipped": "not offered"},
        },
        "graph_decode": {
            "rows": [{"batch": 64, "decode_tokens_per_s": 18000.0}, {"batch": 128, "decode_tokens_per_s": 20000.0}],
            "rows_matched_context": [
                {"batch": 64, "decode_tokens_per_s": 9000.0},
                {"batch": 128, "decode_tokens_per_s": 16000.0},
            ],
        },
    }
    add_ratios(out)
    assert out["ratio_park_over_sync"] == 3.0 and "ratio_park_over_abort" not in out
    assert out["no_ratio"] == {"park_over_abort": "abort did not run (not offered)"}
    assert out["graph_decode_batch"] == 128 and out["graph_decode_tokens_per_s"] == 20000.0
    assert out["ratio_park_decode_over_graph_decode"] == pytest.approx(0.7)
    assert out["graph_decode_matched_context_batch"] == 128
    assert out["ratio_park_decode_over_graph_decode_matched_context"] == pytest.approx(14000 / 16000)
    out["modes"]["sync"] = {**row, "per_round_samples_per_s": [2.0, 0.0]}  # a round that made nothing
    out["modes"]["park"]["per_round_samples_per_s"] = [6.0, 5.0]
    add_ratios(out)
    assert out["ratio_park_over_sync_per_round"] == [3.0, None]
    out["modes"]["park"]["measured_steps"] = 2  # below the rule: neither decode ratio, each says why
    add_ratios(out)
    assert not [k for k in out if k.startswith("ratio_park_decode")]
    assert set(out["no_ratio"]) >= {"park_decode_over_graph_decode", "park_decode_over_graph_decode_matched_context"}


def test_the_matched_context_weighs_each_decoded_token_by_where_it_sits():
    """A request of length L decodes from contexts prompt .. prompt + L - 1: one of 1 and one of 3 tokens decode 4
    tokens at positions 0, 0, 1, 2 (mean 0.75, rounded to 1); long requests pull the mean up, as they pull attention."""
    from bench._graph_baseline import decode_weighted_context

    assert decode_weighted_context(64, [1, 3]) == 65
    assert decode_weighted_context(64, [1000]) == 64 + 500  # 999 / 2 rounded
    assert decode_weighted_context(64, [100] * 9 + [10_000]) > 64 + 4_000  # one long request dominates
    assert decode_weighted_context(64, []) == 64


def test_the_baseline_at_a_long_context_runs_only_the_batches_that_fit_the_kv_buffer_and_the_sequence():
    """The 202M GPT keeps 64 KiB of keys and values per token (16 layers, hidden 1,024, bf16): a 40 GiB buffer holds
    about 590,000 tokens at 90%, so from 16,000 tokens a batch of 32 fits and 64 does not (from 16,384 none: the
    second prompt never prefills beside the first one's decode token); from 1,417 every batch
    up to 256 does. A request also needs its context and what ``decode_rate`` asks it for within the sequence: at
    the 8,192 cut (8,256 tokens) from 8,176 a batch of 16 prefills in 8 steps and fits, one of 32 takes 16 and
    does not."""
    from dataclasses import replace

    from bench._gpu import decode_window_tokens
    from bench._graph_baseline import batches_that_fit
    from bench._workload import MODELS

    shape = replace(MODELS["gpt200m"], prompt_len=64, max_tokens=32768)  # the reasoning shape's prompts
    batches = [16, 32, 64, 128, 256]
    assert batches_that_fit(batches, 16000, shape, 40.0) == [16, 32]
    assert batches_that_fit(batches, 16384, shape, 40.0) == []  # one prompt fills a step: the second never prefills
    assert batches_that_fit(batches, 1417, shape, 40.0) == batches
    assert batches_that_fit(batches, 16000, shape, 1.0) == []
    assert decode_window_tokens(16, 8176) == 3 + 8 + 64 + 4 and decode_window_tokens(32, 8176) == 3 + 16 + 64 + 4
    assert batches_that_fit(batches, 8176, replace(shape, max_tokens=8192), 40.0) == [16]


def admitted_at(batch: int, prompt_len: int, per_step: int = 16384) -> list[int]:
    """The engine step (1-based) each of ``batch`` prompts is prefilled at, as megatron-core 0.19.2 schedules them
    without chunked prefill: whole prompts while the step's tokens (one per admitted request decoding, plus the
    prompts) stay within ``per_step``. Written here apart from bench._gpu.prefill_steps, which it checks."""
    steps: list[int] = []
    step = 0
    while len(steps) < batch:
        step += 1
        tokens = len(steps)  # every request admitted so far decodes one token this step
        before = len(steps)
        while len(steps) < batch and tokens + prompt_len <= per_step:
            steps.append(step)
            tokens += prompt_len
        assert len(steps) > before, "a prompt that never fits"
    return steps


@pytest.mark.parametrize(
    "batch,prompt_len", [(16, 832), (256, 832), (256, 1715), (64, 4096), (128, 4096), (32, 8176), (32, 16000)]
)
def test_every_request_of_a_decode_rate_row_still_decodes_when_its_window_ends(batch: int, prompt_len: int):
    """decode_rate asks each request for decode_window_tokens and times the steps after every prompt is prefilled:
    a request admitted at step s makes one token a step from s on (its prefill step's first), so it ends at step
    s + budget - 1, which must come after the window's last step. On the H200 at ca6c37b, the budget from the tokens alone (32 prefill steps from 4,096 tokens
    for 128 prompts) lost exactly the 16 requests admitted in the first 5 of the 43 steps megatron took: 112 of 128
    decoding at the window's end. The count below reproduces that 16 from the old budget."""
    from bench._gpu import DECODE_WINDOW, WARM_STEPS, decode_window_tokens, prefill_steps

    admitted = admitted_at(batch, prompt_len)
    assert prefill_steps(batch, prompt_len) == admitted[-1]
    window_end = max(WARM_STEPS, admitted[-1]) + DECODE_WINDOW
    budget = decode_window_tokens(batch, prompt_len)
    assert budget is not None
    assert all(s + budget - 1 > window_end for s in admitted)
    if (batch, prompt_len) == (128, 4096):
        old = WARM_STEPS + -(-batch * prompt_len // 16384) + DECODE_WINDOW + 4
        assert (prefill_steps(batch, prompt_len), sum(s + old - 1 <= window_end for s in admitted)) == (43, 16)
    assert prefill_steps(2, 16384) is None and decode_window_tokens(2, 16384) is None


def test_a_long_context_row_that_lost_requests_is_an_error_and_the_contexts_after_it_are_not_run():
    """``rows_by_context`` on a scripted engine: a row whose window held its whole batch is kept; one that lost
    requests (megatron fails a prompt it cannot prefill and steps on) is recorded as the context's error, the
    contexts after it are recorded as not run, and ``graph_context_errors`` names every one of them."""
    from dataclasses import replace

    from bench._graph_baseline import graph_context_errors, rows_by_context
    from bench._workload import MODELS

    class Scripted:
        def decode_rate(self, batch: int, *, prompt_len: int) -> dict:
            held = batch if prompt_len < 8000 else 0  # from 8,000 tokens every prompt "fails"
            return {"batch": batch, "window_start": {"decode_requests": held}, "decode_requests_at_window_end": held}

    shape = replace(MODELS["gpt200m"], max_tokens=32768)
    out = rows_by_context(Scripted(), [4096, 8192, 2048], [16, 32], shape, 40.0)
    assert [len(e["rows"]) for e in out] == [2, 0, 0]
    assert "batch 16: 0 requests decoding" in out[1]["error"] and "not run" in out[2]["error"]
    assert [e.split(":")[0] for e in graph_context_errors({"graph_decode": {"rows_by_context": out}})] == [
        "8192",
        "2048",
    ]


def test_the_graph_contexts_option_is_refused_where_the_baseline_does_not_run_or_out_of_range(capsys):
    """``--graph-contexts`` is never ignored: on the CPU (no baseline), beside ``--no-graph-baseline``, or with a
    context the sequence cannot hold or that is not a number, the bench stops and names the option and the value."""
    for argv, said in (
        (["--workload", "reasoning", "--smoke", "--graph-contexts", "512"], "runs with the graph-decode baseline"),
        (["--workload", "reasoning", "--no-graph-baseline", "--graph-contexts", "4096"], "without --no-graph-baseline"),
        (["--workload", "reasoning", "--graph-contexts", "4096,99999"], "1 to 16,384"),
        (["--workload", "reasoning", "--graph-contexts", "16000"], "no batch of [16, 32, 64, 128, 256] fits"),
        (["--workload", "reasoning", "--max-len", "32768", "--buffer-gb", "1", "--graph-contexts", "16000"], "1 GiB"),
        (["--workload", "reasoning", "--graph-contexts", "4k"], "whole numbers of tokens"),
    ):
        with pytest.raises(SystemExit):
            inflight_handoff.parse_args(argv)
        err = capsys.readouterr().err
        assert "--graph-contexts" in err and said in err, (argv, err)
    args, *_ = inflight_handoff.parse_args(
        ["--workload", "reasoning", "--max-len", "32768", "--graph-contexts", "4096,16000"]
    )
    assert args.graph_contexts == [4096, 16000]
    args, *_ = inflight_handoff.parse_args(["--workload", "reasoning"])
    assert args.graph_contexts == []
    from bench._graph_baseline import graph_context_errors

    lost = {"graph_decode": {"rows_by_context": [{"context_tokens": 4096, "rows": [{}]}, {"context_tokens": 16000,
                                                 "rows": [], "error": "TokenOverflowError: too long"}]}}  # fmt: skip
    assert graph_context_errors(lost) == ["16000: TokenOverflowError: too long"]
    assert graph_context_errors({"graph_decode": {"rows": []}}) == [] and graph_context_errors({}) == []


def test_release_model_graphs_drops_megatrons_cache_entry_and_runners(monkeypatch):
    from types import SimpleNamespace

    import torch
    from megatron.core.transformer import utils as mutils

    from bench._handoff import release_model_graphs

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    mgr = SimpleNamespace(cudagraph_runners=["runner bound to a KV buffer"], custom_cudagraphs_lookup_table={1: 2})
    monkeypatch.setattr(mutils, "cuda_graph_attr_cache", {id(model): {"cudagraph_manager": [[model[0], mgr]]}})
    release_model_graphs(model)
    assert id(model) not in mutils.cuda_graph_attr_cache
    assert mgr.cudagraph_runners == [] and mgr.custom_cudagraphs_lookup_table == {}


def test_a_modes_handoff_counts_join_its_rounds_and_need_every_round():
    """The groups in flight at each measured handoff, over rounds: joined in order, the empty handoffs counted
    (drain's figure depends on how many of its handoffs found nothing to wait for); a round that did not record
    them leaves the mode without the field, never with part of it."""
    from bench._handoff import summarize

    def run(held: list[int] | None) -> dict:
        r = {
            "measured_s": 10.0, "state_s": {"Generating": 8.0, "Draining": 2.0}, "draining_s": [1.0, 1.0],
            "fresh_samples": 20, "trained_samples": 20, "step_samples_per_s": [2.0, 2.0], "spanning_rollouts": 0,
            "max_version_span": 0, "decode_tokens": 100, "decode_steps": 10, "active_sum": 10,
            "occupancy_samples": 5, "idle_samples": 0, "spanning_groups_trained": 0, "measured_steps": 2,
            "cpu_s": 5.0, "loadavg_start": 1.0, "loadavg_end": 1.0, "cut_by_budget": False, "warmup_steps": 1,
            "peak_allocated_gib": None, "engine_backend": "cpu",
        }  # fmt: skip
        return r if held is None else {**r, "groups_in_flight_at_handoff": held}

    row = summarize([run([0, 7]), run([4, 0])])
    assert row["groups_in_flight_at_handoff"] == [0, 7, 4, 0] and row["handoffs_with_nothing_in_flight"] == 2
    partial = summarize([run([0, 7]), run(None)])
    assert "groups_in_flight_at_handoff" not in partial and "handoffs_with_nothing_in_flight" not in partial


def test_the_graph_sizing_option_reaches_both_engine_paths_and_the_baseline_and_is_refused_without_graphs(capsys):
    """``--graph-sizing`` is never ignored: without CUDA graphs (the CPU) the bench stops naming it; with them it is
    each engine path's ``cuda_graph_sizing``, and a linearly sized run is a workload of its own on the page."""
    with pytest.raises(SystemExit):
        inflight_handoff.parse_args(["--workload", "reasoning", "--smoke", "--graph-sizing", "linear"])
    assert "--graph-sizing linear sizes CUDA graphs" in capsys.readouterr().err
    args, _, shape, _ = inflight_handoff.parse_args(["--workload", "reasoning", "--graph-sizing", "linear"])
    assert (args.graph_sizing, args.cuda_graphs) == ("linear", 16)
    assert inflight_handoff.parse_args(["--workload", "reasoning"])[0].graph_sizing is None
    smoke = ["--workload", "reasoning", "--smoke", "--graph-sizing", "linear", "--graph-sizing", "default"]
    assert inflight_handoff.parse_args(smoke)[0].graph_sizing is None  # the stages' CPU twins: megatron's own
    from bench import _handoff
    from colo_fsm.adapters.megatron.coordinator_config import CoordinatorConfig
    from colo_fsm.adapters.megatron.engine import GenerationConfig

    seen = []
    real_gen, real_coord = GenerationConfig.__init__, CoordinatorConfig.__init__

    class Stop(Exception):
        pass

    def record(real):
        def init(self, *a, **kw):
            real(self, *a, **kw)
            seen.append((type(self).__name__, self.cuda_graph_sizing))
            raise Stop

        return init

    import colo_fsm.adapters.megatron.coordinator as coordinator

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GenerationConfig, "__init__", record(real_gen))
        mp.setattr(CoordinatorConfig, "__init__", record(real_coord))
        mp.setattr(coordinator, "coordinator_dependencies", lambda: (True, ""))
        args.device = "cuda"
        for build in (_handoff.direct_engine, _handoff.coordinator_engine):
            with pytest.raises(Stop):
                build("park", args, shape, object(), object(), lambda: 0, 8256)
    assert seen == [("GenerationConfig", "linear"), ("CoordinatorConfig", "linear")]
    from bench.gpu_runs import workload_model

    run = {"model": "gpt200m", "engine": "coordinator"}
    assert workload_model(run) == "gpt200m on the coordinator loop"
    assert workload_model({**run, "cuda_graph_sizing": "exponential"}) == "gpt200m on the coordinator loop"
    assert (
        workload_model({**run, "cuda_graph_sizing": "linear"})
        == "gpt200m on the coordinator loop with linear CUDA graphs"
    )


def test_the_consensus_interval_option_is_the_coordinator_loops_and_refused_elsewhere(capsys):
    """``--ep-consensus-interval`` is never ignored: on the direct engine (no consensus to take) or below 1 the
    bench stops naming it; on the coordinator loop it is the run's (the JSON records what the loop got)."""
    for argv, said in (
        (["--ep-consensus-interval", "20"], "it needs --engine coordinator (not direct)"),
        (["--engine", "coordinator", "--ep-consensus-interval", "0"], "a positive number of loop iterations"),
    ):
        with pytest.raises(SystemExit):
            inflight_handoff.parse_args(["--workload", "reasoning", "--smoke", *argv])
        err = capsys.readouterr().err
        assert "--ep-consensus-interval" in err and said in err, err
    args = inflight_handoff.parse_args(["--workload", "reasoning", "--engine", "coordinator"])[0]
    assert args.ep_consensus_interval is None and inflight_handoff.consensus_interval(args) == 1
    args = inflight_handoff.parse_args(
        ["--workload", "reasoning", "--engine", "coordinator", "--ep-consensus-interval", "20"]
    )[0]
    assert inflight_handoff.consensus_interval(args) == 20
