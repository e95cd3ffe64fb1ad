"""The graph-decode baseline made like a loop's decode steps (``--graph-loop-costs``): its plan, its rows, its
option, its page lines and its stage, on the CPU (the rows themselves run on a GPU)."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import replace
from types import SimpleNamespace

import pytest

import bench.inflight_handoff as inflight_handoff
from bench import gpu_report, gpu_stages
from bench._gpu import BenchEngine, prefill_steps, prefill_steps_of, request_budget
from bench._graph_baseline import (
    LOOP_BATCHES,
    LOOP_VARIANTS,
    decode_weighted_context,
    graph_context_errors,
    linear_graph_rows,
    loop_cost_plan,
    loop_cost_rows,
    token_weighted_contexts,
)
from bench._workload import output_length

STAGE = next(s for s in gpu_stages.STAGES if s.name == "reasoning-8k-graph-loop-costs")


def _stage_shape():
    """The shape the stage's own command line gives (the reasoning workload at cut 8,192, the 202M GPT)."""
    argv = list(STAGE.command(gpu_stages.Path("out")))
    _, _, shape, _ = inflight_handoff.parse_args(argv[argv.index("--workload") :])
    return shape


SHAPE_8K = _stage_shape()


def _lengths(shape, n=400):
    return [output_length(0, i, j, shape) for i in range(n) for j in range(shape.samples_per_group)]


def test_prefill_steps_of_prompts_of_many_lengths_admits_them_in_order_and_agrees_with_one_length():
    for batch, n in ((16, 832), (256, 1715), (128, 4096), (32, 8176)):
        assert prefill_steps_of([n] * batch) == prefill_steps(batch, n)
    # 10,000 fits the first step; 7,000 does not fit what is left (6,384), so it waits; the next step has 16,383
    assert prefill_steps_of([10_000, 7_000, 100]) == 2
    assert prefill_steps_of([10_000, 100, 7_000]) == 2
    assert prefill_steps_of([20_000]) is None and prefill_steps_of([]) == 0
    # what decode_rate asks each request for: one length as before; many lengths their prefill steps again to spare
    assert request_budget([1417] * 64) == 3 + prefill_steps(64, 1417) + 64 + 4
    assert request_budget([10_000, 7_000, 100]) == 3 + 2 + 64 + 4 + 2


def test_contexts_are_drawn_as_the_workloads_decoded_tokens_are():
    """Each within its request's span, the same for a seed, and their mean the workload's token-weighted mean
    decode context (the baseline's matched context) within 3% over many draws."""
    lengths = _lengths(SHAPE_8K)
    drawn = token_weighted_contexts(SHAPE_8K.prompt_len, lengths, 20_000, seed=1)
    assert drawn == token_weighted_contexts(SHAPE_8K.prompt_len, lengths, 20_000, seed=1)
    assert drawn != token_weighted_contexts(SHAPE_8K.prompt_len, lengths, 20_000, seed=2)
    assert SHAPE_8K.prompt_len <= min(drawn) and max(drawn) < SHAPE_8K.prompt_len + max(lengths)
    mean = decode_weighted_context(SHAPE_8K.prompt_len, lengths)
    assert statistics.fmean(drawn) == pytest.approx(mean, rel=0.03)
    assert token_weighted_contexts(7, [0, 0], 3, seed=0) == [7, 7, 7]


def test_the_plan_makes_the_graph_like_a_loop_one_way_at_a_time_and_says_what_does_not_fit():
    """On the stage's own shape (the reasoning workload at 8,192: 64-token prompts, sequences of 8,256) every row
    fits, the mixed-context rows included, their windows the tokens decode_rate asks for; at 32,768 a draw past one
    prefill step is skipped and says why, as is a batch past a 1 GiB buffer."""
    assert (SHAPE_8K.prompt_len, SHAPE_8K.max_tokens, SHAPE_8K.max_active_requests) == (64, 8192, 256)
    lengths = _lengths(SHAPE_8K)
    context = decode_weighted_context(SHAPE_8K.prompt_len, lengths)
    assert context == 1417
    plan = loop_cost_plan(SHAPE_8K, lengths, context, 40.0, 0, list(LOOP_BATCHES))
    per_variant = {"between graphs": LOOP_BATCHES, "as the loop": LOOP_BATCHES}
    assert LOOP_VARIANTS[-1] == "linear graphs"  # timed on a second engine (linear_graph_rows), not in this plan
    assert [(p["variant"], p["batch"]) for p in plan] == [
        (v, b) for v in LOOP_VARIANTS[:-1] for b in per_variant.get(v, (16, 32, 64, 128))
    ]
    assert [p["skipped"] for p in plan if p.get("skipped")] == []
    for p in plan:
        assert p["logprobs"] == (p["variant"] in ("log-probs", "as the loop"))
        assert p["sampled"] == (p["variant"] in ("sampled", "as the loop"))
        assert (p["contexts"] is not None) == (p["variant"] in ("mixed contexts", "as the loop"))
        if p["contexts"] is not None:
            assert len(p["contexts"]) == p["batch"]
            assert max(p["contexts"]) + request_budget(p["contexts"]) <= SHAPE_8K.sequence_length
    clipped = 0
    for seed in range(40):  # every seed's mixed rows fit at 8,192, a context at the sequence's end drawn back
        rows = loop_cost_plan(SHAPE_8K, lengths, context, 40.0, seed, [120])
        assert not any(p.get("skipped") for p in rows)
        clipped += sum(p.get("clipped", 0) for p in rows)
        for p in rows:
            if p["contexts"] is not None:
                assert max(p["contexts"]) + request_budget(p["contexts"]) <= SHAPE_8K.sequence_length
    assert 0 < clipped < 40 * 5
    shape_32k = replace(SHAPE_8K, max_tokens=32768)
    long = loop_cost_plan(shape_32k, [20_000] * 8, context, 40.0, 0, [120])  # every draw past one prefill step
    assert [p["variant"] for p in long if p.get("skipped")] == ["mixed contexts"] * 4 + ["as the loop"]
    assert all("not prefilled in one step" in p["skipped"] for p in long if p.get("skipped"))
    small = loop_cost_plan(SHAPE_8K, lengths, context, 1.0, 0, [120])
    assert any("KV buffer" in (p.get("skipped") or "") for p in small)


def test_a_row_that_lost_requests_is_an_error_and_the_rows_after_it_are_not_run():
    calls = []

    class Scripted:
        def decode_rate(self, batch, *, prompt_len, logprobs, sampled, contexts):
            calls.append((batch, prompt_len, logprobs, contexts is not None))
            held = 0 if (logprobs and contexts is not None) else batch  # "as the loop" loses its requests
            return {"batch": batch, "step_ms": 5.0, "window_start": {"decode_requests": held},
                    "decode_requests_at_window_end": held}  # fmt: skip

    plan = [
        {"variant": "between graphs", "batch": 40, "logprobs": False, "sampled": False, "contexts": None},
        {
            "variant": "mixed contexts",
            "batch": 64,
            "logprobs": False,
            "sampled": False,
            "contexts": [9999] * 64,
            "skipped": "no room",
        },
        {
            "variant": "as the loop",
            "batch": 65,
            "logprobs": True,
            "sampled": True,
            "contexts": [1400] * 65,
            "clipped": 1,
        },
        {"variant": "as the loop", "batch": 120, "logprobs": True, "sampled": True, "contexts": [1400] * 120},
    ]
    rows = loop_cost_rows(Scripted(), plan, 1417)
    assert calls == [(40, 1417, False, False), (65, 1417, True, True)]
    assert rows[0]["step_ms"] == 5.0 and rows[0]["variant"] == "between graphs"
    assert rows[1] == {"variant": "mixed contexts", "batch": 64, "skipped": "no room"}
    assert rows[2]["clipped"] == 1
    assert "0 requests decoding" in rows[2]["error"] and rows[3]["error"].startswith("not run: as the loop at batch 65")
    errors = graph_context_errors({"graph_decode": {"rows_loop_costs": rows}})
    assert [e.split(":")[0] for e in errors] == ["as the loop, batch 65", "as the loop, batch 120"]


def test_decode_rate_prefills_each_request_from_its_own_context_and_asks_for_log_probs(monkeypatch):
    """``BenchEngine.decode_rate`` on a scripted engine: one prompt per context, of that length, a budget that
    outlasts the window, and log-probs asked for where the row says; a context list of the wrong length is refused."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    added = []

    class Engine:
        request_counter = itertools.count()
        waiting_request_ids: list[int] = []

        def add_request(self, rid, prompt, sp):
            added.append((len(prompt), sp.num_tokens_to_generate, sp.return_log_probs, sp.top_k))

        def step_modern(self):
            return {}

        def has_unfinished_requests(self):
            return False

    eng = BenchEngine.__new__(BenchEngine)
    eng.engine = Engine()
    eng.tokenizer = SimpleNamespace(eod=0)
    eng.context = SimpleNamespace(max_tokens=16384, num_prefill_requests=0, num_decode_requests=3)
    row = eng.decode_rate(3, prompt_len=1417, logprobs=True, sampled=True, contexts=[100, 2000, 900])
    assert [a[0] for a in added] == [100, 2000, 900] and all(a[2] for a in added) and {a[3] for a in added} == {0}
    assert {a[1] for a in added} == {request_budget([100, 2000, 900])}
    assert row["contexts_mean"] == pytest.approx(1000) and row["contexts_max"] == 2000 and row["logprobs"]
    assert row["sampled"]
    added.clear()
    row = eng.decode_rate(2, prompt_len=50)  # the baseline's own rows: as before
    assert added == [(50, request_budget([50, 50]), False, 1)] * 2 and "logprobs" not in row and "sampled" not in row
    with pytest.raises(ValueError, match="2 contexts, expected one per request"):
        eng.decode_rate(3, contexts=[1, 2])


def test_the_option_is_read_never_ignored(capsys):
    for argv, said in (
        (["--workload", "reasoning", "--smoke", "--graph-loop-costs", "40"], "runs with the graph-decode baseline"),
        (["--workload", "reasoning", "--no-graph-baseline", "--graph-loop-costs", "40"], "without --no-graph-baseline"),
        (["--workload", "reasoning", "--graph-loop-costs", "40,300"], "1 to 256"),
        (["--workload", "reasoning", "--graph-loop-costs", "forty"], "whole numbers of requests"),
    ):
        with pytest.raises(SystemExit):
            inflight_handoff.parse_args(argv)
        err = capsys.readouterr().err
        assert "--graph-loop-costs" in err and said in err, (argv, err)
    args, *_ = inflight_handoff.parse_args(["--workload", "reasoning", "--graph-loop-costs", "25,40,65,120"])
    assert args.graph_loop_costs == [25, 40, 65, 120]
    args, *_ = inflight_handoff.parse_args(["--workload", "reasoning", "--smoke", "--graph-loop-costs", ""])
    assert args.graph_loop_costs == []


def test_the_stage_and_its_page_lines():
    cmd = STAGE.command(gpu_stages.Path("out"))
    assert cmd[cmd.index("--graph-loop-costs") + 1] == "25,40,65,120" and "--graph-only" in cmd
    assert STAGE.command(gpu_stages.Path("out"), smoke=True)[-2:] == ["--graph-loop-costs", ""]
    d = {
        "_file": "g.json",
        "graph_decode": {
            "context_tokens": 800,
            "rows": [{"batch": 32, "step_ms": 3.0}, {"batch": 64, "step_ms": 4.0}],
            "matched_context_tokens": 1400,
            "rows_matched_context": [{"batch": 32, "step_ms": 4.0}, {"batch": 64, "step_ms": 6.0}],
            "loop_costs_context_tokens": 1400,
            "rows_loop_costs": [
                {"variant": "between graphs", "batch": 40, "step_ms": 5.5},
                {"variant": "as the loop", "batch": 40, "step_ms": 6.0, "contexts_mean": 1100.0, "contexts_max": 8000},
                {"variant": "mixed contexts", "batch": 128, "skipped": "no room"},
            ],
        },
    }
    lines = gpu_report.loop_cost_lines([d])
    assert "| between graphs | 40 | uniform | 5.50 | 4.50 | 1.222 |" in lines
    # from 1,100 tokens, halfway between the two contexts: 3.5 and 5.0 ms at batches 32 and 64, so 3.875 at 40
    assert "| as the loop | 40 | 1,100, 8,000 | 6.00 | 3.88 | 1.548 |" in lines
    assert "| mixed contexts | 128 | | no room | | |" in lines


def _bench_graphs(sizing="default"):
    """megatron-core's own graph plan for the bench's engine (16 graphs, 256 requests, one rank) at ``sizing``."""
    from bench._model_costs import graph_plan

    return graph_plan(sizing, 256)


def test_megatron_sizes_the_decode_graphs_at_powers_of_two_by_default_and_every_16_requests_linearly():
    """The graphs the loop-cost rows time between (the bench's 16 graphs at 256 requests: megatron's builder), and
    the second engine's; megatron-core 0.19.2 takes the linear sizing through InferenceConfig."""
    from megatron.core.inference.config import CudaGraphSizingDistribution, InferenceConfig

    def decode_graphs(sizing):
        return sorted({d.decode_req_count for d in _bench_graphs(sizing) if not d.prefill_req_count})

    assert decode_graphs("default") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert decode_graphs("linear") == list(range(16, 257, 16))
    cfg = InferenceConfig(num_cuda_graphs=16, cuda_graph_sizing_distribution=CudaGraphSizingDistribution("linear"))
    assert cfg.cuda_graph_sizing_distribution is CudaGraphSizingDistribution.LINEAR


def test_megatron_0_19_2_runs_a_decode_step_on_the_next_power_of_two_graph_at_the_benchs_graph_count():
    """The fact the notes give for one difference between the graph alone and a loop's step: with its default
    sizing, 16 graphs at 256 requests capture decode steps of 1, 2, 4, ..., 256 requests, and a step of 65 decoding
    requests runs the 128 graph (sync's 40 the 64 graph, park's 113-120 the 128 one)."""
    from megatron.core.inference.batch_dimensions_utils import CUDAGraphBatchDimensionBuilder, InferenceBatchDimensions

    dims = _bench_graphs()
    for running, graph in ((25, 32), (40, 64), (65, 128), (113, 128), (120, 128)):
        real = InferenceBatchDimensions(token_count=running, prefill_req_count=0, decode_req_count=running)
        matched = CUDAGraphBatchDimensionBuilder.match_graph_config(real, dims, match_ep_token_counts=False)
        assert matched is not None and matched.decode_req_count == graph, running


def _scripted_engines(monkeypatch, lose_batch=None, fail_sizing=None):
    """BenchEngine, the model build and the graphs' release replaced by scripts (the rest of the baseline's code
    runs as on the GPU); returns the options each engine was built with and what was released. An engine of
    ``fail_sizing`` fails to build; a row of ``lose_batch`` loses its requests."""
    import torch

    import bench._gpu as gpu
    import bench._handoff as handoff
    import colo_fsm.adapters.megatron.model as model_mod

    built, released = [], []

    class Engine:
        def __init__(self, model, tok, opts):
            built.append(opts)
            if fail_sizing is not None and opts.graph_sizing == fail_sizing:
                raise RuntimeError("capture failed")
            sizes = list(range(16, 257, 16)) if opts.graph_sizing == "linear" else [2**i for i in range(9)]
            self.build = {"decode_graph_requests": sizes, "total_s": 1.5}

        def decode_rate(self, batch, *, prompt_len, logprobs=False, sampled=False, contexts=None):
            held = 0 if batch == lose_batch else batch
            return {"batch": batch, "step_ms": 1.0 + batch / 100, "decode_tokens_per_s": batch * 1000 / (1 + batch / 100),
                    "window_start": {"decode_requests": held}, "decode_requests_at_window_end": held}  # fmt: skip

        def shutdown(self, graphs):
            released.append(graphs)

    monkeypatch.setattr(gpu, "BenchEngine", Engine)
    monkeypatch.setattr(model_mod, "build_model", lambda cfg: object())
    monkeypatch.setattr(handoff, "release_model_graphs", lambda model: released.append("graphs"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return built, released


def test_the_baseline_times_its_rows_then_the_loop_costs_then_the_linear_graphs_on_a_second_engine(monkeypatch):
    """``graph_decode_baseline`` with ``--graph-loop-costs`` on scripted engines: the uniform rows from both
    contexts, every planned loop-cost row, then the linear graphs on a second engine; both engines released; the
    JSON names each engine's decode graphs. Where a loop-cost row fails, no second engine is built."""
    from bench._graph_baseline import graph_decode_baseline

    built, released = _scripted_engines(monkeypatch)
    args = SimpleNamespace(
        seed=0, buffer_gb=40.0, cuda_graphs=16, graph_contexts=[], graph_loop_costs=[25, 40, 65, 120]
    )
    g = graph_decode_baseline(args, SHAPE_8K, "gpt200m", _lengths(SHAPE_8K))["graph_decode"]
    assert [o.graph_sizing for o in built] == [None, "linear"] and released == [True, "graphs"] * 2
    assert [r["batch"] for r in g["rows"]] == [16, 32, 64, 128, 256] and g["matched_context_tokens"] == 1417
    variants = [r["variant"] for r in g["rows_loop_costs"]]
    assert [v for v in LOOP_VARIANTS if v in variants] == list(LOOP_VARIANTS)
    assert [r["batch"] for r in g["rows_loop_costs"] if r["variant"] == "linear graphs"] == [25, 40, 64, 65, 120, 128]
    assert g["decode_graph_requests"][-2:] == [128, 256] and g["linear_decode_graph_requests"][:2] == [16, 32]
    assert not graph_context_errors({"graph_decode": g})
    built, _ = _scripted_engines(monkeypatch, lose_batch=65)
    g = graph_decode_baseline(args, SHAPE_8K, "gpt200m", _lengths(SHAPE_8K))["graph_decode"]
    assert [o.graph_sizing for o in built] == [None]  # no second engine after a failed row
    assert "linear_decode_graph_requests" not in g
    assert "linear graphs" not in [r["variant"] for r in g["rows_loop_costs"]]
    assert graph_context_errors({"graph_decode": g})[0].startswith("between graphs, batch 65")
    built, released = _scripted_engines(monkeypatch, fail_sizing="linear")
    g = graph_decode_baseline(args, SHAPE_8K, "gpt200m", _lengths(SHAPE_8K))["graph_decode"]
    assert [o.graph_sizing for o in built] == [None, "linear"] and released == [True, "graphs"]
    assert [r["batch"] for r in g["rows"]] == [16, 32, 64, 128, 256]  # the first engine's rows are kept
    linear = [r for r in g["rows_loop_costs"] if r["variant"] == "linear graphs"]
    assert len(linear) == 6
    assert all("the linearly sized engine failed: RuntimeError: capture failed" in r["error"] for r in linear)
    assert len(graph_context_errors({"graph_decode": g})) == 6


def test_the_linear_graphs_rows_run_on_a_second_engine_sized_linearly_and_let_it_go(monkeypatch):
    """``linear_graph_rows`` builds a fresh model and an engine with ``graph_sizing="linear"``, times each batch
    from the context as a ``linear graphs`` row, and releases the engine and its graphs even when a row fails."""
    built, released = _scripted_engines(monkeypatch, lose_batch=128)
    args = SimpleNamespace(seed=0, buffer_gb=40.0, cuda_graphs=16)
    out = linear_graph_rows(args, SHAPE_8K, 1417, [40, 65, 128])
    assert [o.graph_sizing for o in built] == ["linear"] and built[0].num_cuda_graphs == 16
    assert [r["variant"] for r in out["rows"]] == ["linear graphs"] * 3
    assert [r.get("step_ms") for r in out["rows"][:2]] == [1.4, 1.65] and "0 requests decoding" in out["rows"][2][
        "error"
    ]
    assert out["linear_decode_graph_requests"] == list(range(16, 257, 16)) and released == [True, "graphs"]


def test_the_baseline_times_the_graphs_the_run_ran_on(monkeypatch):
    """A run with ``--graph-sizing linear`` gets its graph-decode baseline from an engine sized the same way, and
    the JSON says which sizing the baseline's graphs had (None: megatron's default)."""
    from bench._graph_baseline import graph_decode_baseline

    built, _ = _scripted_engines(monkeypatch)
    args = SimpleNamespace(seed=0, buffer_gb=40.0, cuda_graphs=16, graph_contexts=[], graph_loop_costs=[])
    assert graph_decode_baseline(args, SHAPE_8K, "gpt200m", _lengths(SHAPE_8K))["graph_decode"]["graph_sizing"] is None
    args.graph_sizing = "linear"
    g = graph_decode_baseline(args, SHAPE_8K, "gpt200m", _lengths(SHAPE_8K))["graph_decode"]
    assert [o.graph_sizing for o in built] == [None, "linear"] and g["graph_sizing"] == "linear"
    assert g["decode_graph_requests"][:2] == [16, 32]
