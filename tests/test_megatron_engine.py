"""The colocated engine on the CPU path: built once, InferenceMode discipline, KV modes, parallelism check."""

from __future__ import annotations

import logging

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401
from megatron.core.inference.utils import InferenceMode

from colo_fsm.adapters.megatron.engine import GenerationConfig, KVCacheMode, MegatronEngine, parse_kv_cache_mode
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.adapters.protocols import GenerationEngine, TextGenerator
from colo_fsm.errors import ConfigError, EngineRebuild, LifecycleError, ParallelismMismatch
from colo_fsm.guards.parallelism import ParallelismWarning

TOK = CharTokenizer("0123456789>")


@pytest.fixture(scope="module")
def model(dist1):  # noqa: F811
    return tiny(TOK)


def test_engine_implements_the_protocols(model):
    eng = MegatronEngine(model, TOK)
    assert isinstance(eng, GenerationEngine) and isinstance(eng, TextGenerator)
    assert eng.reads_weights_in_place is True


def test_cpu_backend_chosen_and_reported_at_start_up(model, caplog):
    eng = MegatronEngine(model, TOK)
    assert eng.backend_name == "cpu"
    with caplog.at_level(logging.INFO, logger="colo_fsm.megatron"):
        eng.bring_up()
    line = next(r.getMessage() for r in caplog.records if "colocated engine up" in r.getMessage())
    assert "backend=cpu" in line and "no CUDA device" in line
    eng.shutdown()


def test_built_once_and_inference_mode_follows_suspend_resume(model):
    InferenceMode.unset_active()
    eng = MegatronEngine(model, TOK)
    eng.bring_up()
    assert InferenceMode.is_active()
    with pytest.raises(EngineRebuild):
        eng.bring_up()
    eng.suspend()
    assert not InferenceMode.is_active()
    waiting = eng.submit(TOK.tokenize("12>"), max_tokens=2)  # accepted while suspended: queued, not decoded
    assert eng.request_counts().queued == 1 and not waiting.done() and eng.steps == 0
    eng.resume()
    assert InferenceMode.is_active()
    assert len(waiting.result(timeout=60).token_ids) == 2
    assert len(eng.generate(["12>"], max_tokens=2)) == 1
    eng.shutdown()
    with pytest.raises(LifecycleError):
        eng.resume()


def test_greedy_is_deterministic_and_completions_carry_the_weight_version(model):
    version = {"v": 7}
    eng = MegatronEngine(model, TOK, weight_version=lambda: version["v"])
    eng.bring_up()
    a = eng.generate(["123>", "45>"], max_tokens=4)
    b = eng.generate(["123>", "45>"], max_tokens=4)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(c.weight_version == 7 for c in a)
    assert all(1 <= len(c.token_ids) <= 4 for c in a)
    ids = eng.generate_ids([TOK.tokenize("123>")] * 3, max_tokens=4, temperature=1.0, seed=3)
    again = eng.generate_ids([TOK.tokenize("123>")] * 3, max_tokens=4, temperature=1.0, seed=3)
    assert [c.token_ids for c in ids] == [c.token_ids for c in again]  # seeded sampling reproduces
    assert all(len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs) for c in ids)
    eng.shutdown()


@pytest.mark.parametrize("mode", ["persist", "offload", "recompute", "OFFLOAD", KVCacheMode.RECOMPUTE])
def test_kv_cache_modes_parse(mode):
    assert GenerationConfig(kv_cache_mode=mode).kv_cache_mode == str(parse_kv_cache_mode(mode))


@pytest.mark.parametrize("bad", ["keep", "", None, 3])
def test_unknown_kv_cache_mode_names_field_value_and_choices(bad):
    with pytest.raises(ConfigError) as exc:
        GenerationConfig(kv_cache_mode=bad)
    assert exc.value.field == "kv_cache_mode" and exc.value.value == bad
    assert "persist" in exc.value.expected and "offload" in exc.value.expected and "recompute" in exc.value.expected


def test_parallelism_check_is_wired_to_the_real_training_config(model):
    assert model.config.tensor_model_parallel_size == 1
    with pytest.raises(ParallelismMismatch) as exc:
        MegatronEngine(model, TOK, GenerationConfig(tensor_model_parallel_size=2))
    assert "2" in str(exc.value) and "tensor_model_parallel_size=1" in str(exc.value)
    with pytest.raises(ParallelismMismatch, match="pipeline_model_parallel_size"):
        MegatronEngine(model, TOK, GenerationConfig(pipeline_model_parallel_size=4))
    with pytest.warns(ParallelismWarning, match="context_parallel_size"):
        MegatronEngine(model, TOK, GenerationConfig(context_parallel_size=2))
    ok = MegatronEngine(model, TOK, GenerationConfig(tensor_model_parallel_size=1))
    assert "tensor_model_parallel_size" in ok.parallelism.compared


def test_dynamic_backend_refused_without_gpu(model):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError) as exc:
        MegatronEngine(model, TOK, GenerationConfig(backend="dynamic"))
    assert exc.value.field == "backend" and "no CUDA device" in exc.value.expected


def test_generation_length_bounded_by_max_sequence_length(model):
    eng = MegatronEngine(model, TOK)
    eng.bring_up()
    with pytest.raises(ConfigError, match="max_tokens"):
        eng.generate(["123>"], max_tokens=40)
    eng.shutdown()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["persist", "offload", "recompute"])
def test_dynamic_engine_suspend_resume_on_gpu(mode):
    from colo_fsm.adapters.megatron.dynamic import dynamic_engine_available

    ok, why = dynamic_engine_available()
    if not ok:
        pytest.skip(f"megatron-core's dynamic engine cannot run here: {why} (scripts/gpu_megatron_check.py runs it)")
    from colo_fsm.adapters.megatron.parallel import init_distributed

    init_distributed(1, device="cuda")
    model = tiny(TOK, device="cuda", max_sequence_length=64, hidden_size=128, num_attention_heads=2)
    eng = MegatronEngine(model, TOK, GenerationConfig(kv_cache_mode=mode, buffer_size_gb=0.5))
    assert eng.backend_name == "dynamic"
    eng.bring_up()
    before = eng.generate(["123>", "45>"], max_tokens=4)
    for _ in range(3):
        eng.suspend()
        assert not InferenceMode.is_active()
        eng.resume()
        assert InferenceMode.is_active()
    assert [c.token_ids for c in eng.generate(["123>", "45>"], max_tokens=4)] == [c.token_ids for c in before]
    eng.shutdown()


def test_dynamic_engine_head_dim_check():
    from types import SimpleNamespace

    from colo_fsm.adapters.megatron.dynamic import check_head_dim

    check_head_dim(SimpleNamespace(kv_channels=64, hidden_size=512, num_attention_heads=8))
    with pytest.raises(ConfigError) as exc:
        check_head_dim(SimpleNamespace(kv_channels=None, hidden_size=32, num_attention_heads=4))
    assert exc.value.field == "kv_channels" and exc.value.value == 8 and "multiple of 16" in exc.value.expected


# -------------------------------------------------------------------------- the rank's own current device
class _RecordingCudaDevice:
    """Stands in for ``torch.cuda.device`` on a CPU machine: records entered indices and the active one."""

    entered: list[int] = []
    active: list[int] = []

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        type(self).entered.append(self.index)
        type(self).active.append(self.index)
        return self

    def __exit__(self, *exc):
        type(self).active.pop()
        return False


@pytest.fixture
def cuda_device_recorder(monkeypatch):
    _RecordingCudaDevice.entered = []
    _RecordingCudaDevice.active = []
    monkeypatch.setattr(torch.cuda, "device", _RecordingCudaDevice)
    return _RecordingCudaDevice


def test_device_context_index_from_the_device_else_local_rank(cuda_device_recorder, monkeypatch):
    from colo_fsm.adapters.megatron.parallel import device_context, rank_device_index

    monkeypatch.setenv("LOCAL_RANK", "3")
    assert rank_device_index("cpu") is None and rank_device_index(torch.device("cuda", 1)) == 1
    assert rank_device_index("cuda") == 3
    with device_context("cpu"):
        assert cuda_device_recorder.active == []  # a no-op on the CPU
    with device_context("cuda"):
        assert cuda_device_recorder.active == [3]
    assert cuda_device_recorder.entered == [3]


def test_engine_entry_points_run_on_the_ranks_own_device_from_any_thread(model, cuda_device_recorder):
    """Rank 1's engine is called from a thread whose current device is cuda:0: every backend call (made on the
    engine thread) and every entry point must run with cuda:1 current."""
    import threading

    from colo_fsm.adapters.batching import StepOutput

    seen: list[tuple[str, list[int]]] = []

    class Backend:  # the one piece faked: records which device was current when the engine called it
        name = "recording"

        def __init__(self):
            seen.append(("build", list(cuda_device_recorder.active)))
            self.rows = []

        def add(self, req):
            seen.append(("add", list(cuda_device_recorder.active)))
            self.rows.append(req.request_id)

        def step(self):
            seen.append(("step", list(cuda_device_recorder.active)))
            rows, self.rows = self.rows, []
            return [StepOutput(r, (1,), (0.0,), "length") for r in rows]

        def abort(self, rid):
            pass

        def suspend(self):
            seen.append(("suspend", list(cuda_device_recorder.active)))
            return 0.0

        def resume(self):
            seen.append(("resume", list(cuda_device_recorder.active)))
            return 0.0

        def shutdown(self):
            seen.append(("shutdown", list(cuda_device_recorder.active)))

    eng = MegatronEngine(model, TOK)
    eng.device = torch.device("cuda", 1)  # as on rank 1 of a 2-GPU run
    eng._make_backend = Backend

    def calls():
        eng.bring_up()
        eng.generate_ids([[1, 2]], max_tokens=1)
        eng.generate(["12>"], max_tokens=1)
        eng.suspend()
        eng.resume()
        eng.shutdown()

    t = threading.Thread(target=calls)
    t.start()
    t.join()
    names = [name for name, _ in seen]
    assert names == ["build", "add", "step", "add", "step", "suspend", "resume", "shutdown"], names
    assert all(active and active[-1] == 1 for _, active in seen), seen
    assert cuda_device_recorder.active == []


def test_trainer_entry_points_run_on_the_ranks_own_device(model, cuda_device_recorder):
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout

    tr = MegatronTrainer(model, pad_id=TOK.pad)
    tr.device = torch.device("cuda", 1)
    seen: list[list[int]] = []

    class Stop(Exception):
        pass

    def enter_training_mode():  # the first thing train_step does; stop there (no CUDA on this machine)
        seen.append(list(cuda_device_recorder.active))
        raise Stop

    tr.enter_training_mode = enter_training_mode
    with pytest.raises(Stop):
        tr.train_step([Rollout((1, 2), (3,), 1.0, 0)])
    tr.offload_buffers()
    tr.restore_buffers()
    assert seen == [[1]] and cuda_device_recorder.entered == [1, 1, 1]


def test_dual_mode_build_registers_the_export_types(dist1, monkeypatch):  # noqa: F811
    from colo_fsm.adapters.megatron import bridge
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model

    calls = []
    monkeypatch.setattr(bridge, "register_inference_linear_types", lambda: calls.append(1) or {})
    try:
        build_model(ModelConfig(vocab_size=TOK.vocab_size, transformer_impl="inference_optimized"))
    except ConfigError as exc:  # no Transformer Engine here: the build stops after registering
        assert exc.field == "transformer_impl"
    assert calls == [1]
    calls.clear()
    build_model(ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, max_sequence_length=16))
    assert calls == []  # a plain local model does not touch megatron-bridge
