"""megatron-core's InferenceConfig as both engine paths build it, and the CUDA-graph sizing passed through it."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("megatron.core.inference.config", reason="megatron-core (the megatron extra)")

from _megatron_util import dist1  # noqa: F401
from megatron.core.inference.config import CudaGraphSizingDistribution

from colo_fsm.adapters.megatron.coordinator_config import CoordinatorConfig, inference_config
from colo_fsm.adapters.megatron.engine import GenerationConfig
from colo_fsm.adapters.megatron.inference_settings import GRAPH_SIZINGS, megatron_inference_config
from colo_fsm.errors import ConfigError


@pytest.mark.parametrize("make", [GenerationConfig, CoordinatorConfig], ids=["direct", "coordinator"])
def test_graph_sizing_is_megatrons_choice_or_none_and_never_set_without_graphs(make) -> None:
    assert make().cuda_graph_sizing is None
    assert make(num_cuda_graphs=16, cuda_graph_sizing=" Linear").cuda_graph_sizing == "linear"
    assert make(num_cuda_graphs=16, cuda_graph_sizing="exponential").cuda_graph_sizing == "exponential"
    for bad in ("log", 3, ""):
        with pytest.raises(ConfigError, match=r"cuda_graph_sizing.*one of \('exponential', 'linear'\)"):
            make(num_cuda_graphs=16, cuda_graph_sizing=bad)
    with pytest.raises(ConfigError, match="cuda_graph_sizing.*'linear'.*num_cuda_graphs is None"):
        make(cuda_graph_sizing="linear")  # no graph captured: the choice would be ignored
    assert GRAPH_SIZINGS == tuple(v.value for v in CudaGraphSizingDistribution)  # megatron's values, all of them


def test_the_coordinator_path_passes_the_sizing_and_builds_what_it_built_before_without_one() -> None:
    """Without a sizing the config is field for field the one both paths built before the sizing existed (megatron's
    own default, exponential), less the consensus interval at expert parallelism 1 (1: a pause lands at the next
    step); at expert parallelism 2 it is that config exactly; with a sizing, only the sizing differs."""
    from megatron.core.inference.config import InferenceConfig, KVCacheManagementMode

    for mode, logprobs in (("persist", "raw"), ("recompute", "processed"), ("offload", "raw")):
        graphs = None if mode == "offload" else 16
        cfg = CoordinatorConfig(kv_cache_mode=mode, num_cuda_graphs=graphs, max_requests=256, logprobs_mode=logprobs)
        before = InferenceConfig(
            block_size_tokens=256,
            buffer_size_gb=1.0,
            max_requests=256,
            max_sequence_length=8256,
            kv_cache_management_mode=KVCacheManagementMode(mode),
            materialize_only_last_token_logits=True,
            num_cuda_graphs=graphs,
            logprobs_mode=f"{logprobs}_logprobs",
        )
        assert inference_config(cfg, 8256, expert_parallel_size=2) == before, mode
        assert before.ep_consensus_interval == 20  # megatron's default, left to it where each check is an all-reduce
        at_one = inference_config(cfg, 8256, expert_parallel_size=1)
        assert at_one.ep_consensus_interval == 1 and at_one != before
        at_one.ep_consensus_interval = 20
        assert at_one == before, mode
    default = inference_config(CoordinatorConfig(num_cuda_graphs=16, max_requests=256), 8256, expert_parallel_size=1)
    linear = inference_config(
        CoordinatorConfig(num_cuda_graphs=16, max_requests=256, cuda_graph_sizing="linear"),
        8256,
        expert_parallel_size=1,
    )
    assert default.cuda_graph_sizing_distribution is CudaGraphSizingDistribution.EXPONENTIAL  # megatron's own
    assert linear.cuda_graph_sizing_distribution is CudaGraphSizingDistribution.LINEAR
    assert (linear.num_cuda_graphs, linear.max_requests, linear.max_sequence_length) == (16, 256, 8256)


def test_the_direct_path_builds_the_same_inference_config_as_the_coordinator_path(monkeypatch) -> None:
    """``DynamicStepBackend`` hands megatron's engine the config the coordinator path builds from the same
    settings, sizing included (megatron's ``MegatronLLM`` replaced by a recorder: the engine itself needs a GPU)."""
    import megatron.core.inference.apis.llm as llm_mod

    from colo_fsm.adapters.megatron.dynamic import DynamicStepBackend

    seen = {}

    class Recorder:
        def __init__(self, *, model, tokenizer, inference_config, use_coordinator):
            seen["config"], seen["use_coordinator"] = inference_config, use_coordinator
            self.engine = types.SimpleNamespace()

    monkeypatch.setattr(llm_mod, "MegatronLLM", Recorder)
    model = torch.nn.Linear(4, 4)
    model.config = types.SimpleNamespace(kv_channels=64, hidden_size=256, num_attention_heads=4)
    settings = dict(kv_cache_mode="persist", buffer_size_gb=2.0, max_requests=256, block_size_tokens=256)
    DynamicStepBackend(model, types.SimpleNamespace(eod=0), max_sequence_length=8256, num_cuda_graphs=16,
                       cuda_graph_sizing="linear", logprobs_mode="processed", **settings)  # fmt: skip
    coordinator = (
        inference_config(  # at expert parallelism 2 it leaves the consensus interval, which only its loop reads
            CoordinatorConfig(num_cuda_graphs=16, cuda_graph_sizing="linear", logprobs_mode="processed", **settings),
            8256,
            expert_parallel_size=2,
        )
    )
    assert seen["use_coordinator"] is False and seen["config"] == coordinator
    assert seen["config"].cuda_graph_sizing_distribution is CudaGraphSizingDistribution.LINEAR
    assert seen["config"].logprobs_mode == "processed_logprobs"
    assert megatron_inference_config(
        block_size_tokens=256, buffer_size_gb=2.0, max_requests=256, max_sequence_length=8256,
        kv_cache_mode="persist", num_cuda_graphs=16, cuda_graph_sizing=None, logprobs_mode="raw",
    ) == inference_config(CoordinatorConfig(num_cuda_graphs=16, **settings), 8256, expert_parallel_size=2)  # fmt: skip


def test_the_engine_hands_its_sizing_to_the_backend(monkeypatch) -> None:
    """``MegatronEngine`` passes ``GenerationConfig.cuda_graph_sizing`` to the dynamic backend it builds."""
    from colo_fsm.adapters.megatron import dynamic
    from colo_fsm.adapters.megatron.engine import MegatronEngine

    got = {}

    class Backend:
        def __init__(self, model, tokenizer, **kw):
            got.update(kw)

    monkeypatch.setattr(dynamic, "DynamicStepBackend", Backend)
    eng = MegatronEngine.__new__(MegatronEngine)
    eng.backend_name, eng.model, eng.tokenizer = "dynamic", None, None
    eng.kv_cache_mode = types.SimpleNamespace(value="persist")
    eng.max_sequence_length, eng.sampling, eng.training_config = 8256, None, None
    eng.config = GenerationConfig(num_cuda_graphs=16, cuda_graph_sizing="linear", max_requests=256)
    eng._make_backend()
    assert (got.get("cuda_graph_sizing"), got.get("num_cuda_graphs")) == ("linear", 16)


def test_on_the_cpu_path_the_graph_settings_are_said_to_have_no_effect(dist1, caplog) -> None:  # noqa: F811
    """The CPU loop captures no CUDA graph: its start-up line names the graph settings that were set, never
    silently dropping them."""
    import logging

    from _megatron_util import tiny

    from colo_fsm.adapters.megatron.engine import MegatronEngine
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

    tok = CharTokenizer("0123456789>")
    eng = MegatronEngine(tiny(tok), tok, GenerationConfig(num_cuda_graphs=16, cuda_graph_sizing="linear"))
    assert eng.backend_name == "cpu"
    with caplog.at_level(logging.INFO, logger="colo_fsm"):
        eng.bring_up()
    try:
        line = next(r.getMessage() for r in caplog.records if "colocated engine up" in r.getMessage())
        assert "kv_cache_mode, num_cuda_graphs and cuda_graph_sizing have no effect" in line, line
    finally:
        eng.shutdown()


def test_the_benchmarks_engine_builds_the_config_it_built_before_through_the_engines_builder() -> None:
    """The benchmarks' own engine (the graph baseline's) takes its ``InferenceConfig`` from the builder colo-fsm's
    engines use: field for field the one it built itself before, in every KV mode, with and without graphs for
    mixed steps and a sizing, so a baseline decodes as the engines do and its figures stand."""
    import itertools

    from megatron.core.inference.config import InferenceConfig, KVCacheManagementMode

    from bench._gpu import EngineOptions, bench_inference_config

    for mode, graphs, decode_only, sizing in itertools.product(
        ("persist", "recompute", "offload"), (None, 16), (False, True), (None, "linear", "exponential")
    ):
        if graphs is None and (decode_only or sizing is not None):
            continue
        opts = EngineOptions(mode=mode, buffer_gb=40.0, max_requests=192, max_sequence_length=8256,
                             block_size_tokens=128, num_cuda_graphs=graphs, decode_only_graphs=decode_only,
                             graph_sizing=sizing)  # fmt: skip
        before: dict = dict(
            block_size_tokens=128, buffer_size_gb=40.0, max_requests=192, max_sequence_length=8256,
            kv_cache_management_mode=KVCacheManagementMode(mode), materialize_only_last_token_logits=True,
            num_cuda_graphs=graphs,
        )  # fmt: skip
        if decode_only:
            before["use_cuda_graphs_for_non_decode_steps"] = False
        if sizing is not None:
            before["cuda_graph_sizing_distribution"] = CudaGraphSizingDistribution(sizing)
        assert bench_inference_config(opts) == InferenceConfig(**before), opts
    assert bench_inference_config(EngineOptions(num_cuda_graphs=16, decode_only_graphs=True)) != (
        bench_inference_config(EngineOptions(num_cuda_graphs=16))
    )
