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
NOEND = CharTokenizer("0123456789>", generates_eod=False)  # the same vocabulary; no request ends before max_tokens


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
    with caplog.at_level(logging.INFO, logger="colo_fsm"):
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


def test_megatron_holds_every_request_colo_fsm_admits(model, monkeypatch):
    """megatron-core's own ``max_requests`` defaults to ``max_active_requests``: before, it defaulted to 128, so
    an engine configured for 256 decoded at most 128 at once and queued the rest out of colo-fsm's reach (the
    H200 handoff bench ran so at 052bb74). A smaller explicit bound is refused, naming both."""
    from colo_fsm.adapters.megatron import dynamic

    assert GenerationConfig(max_active_requests=256).engine_max_requests == 256
    assert GenerationConfig(max_active_requests=256, max_requests=300).engine_max_requests == 300
    with pytest.raises(ConfigError) as err:
        GenerationConfig(max_active_requests=256, max_requests=128)
    assert err.value.field == "max_requests" and err.value.value == 128
    assert "at least max_active_requests=256" in str(err.value)
    built: dict = {}
    monkeypatch.setattr(dynamic, "DynamicStepBackend", lambda *a, **kw: built.update(kw) or "backend")
    eng = MegatronEngine(model, TOK, GenerationConfig(max_active_requests=256))
    eng.backend_name = "dynamic"  # the GPU path's constructor call, without a GPU
    assert eng._make_backend() == "backend" and built["max_requests"] == 256
    monkeypatch.setattr(eng.training_config, "tensor_model_parallel_size", 4)
    eng.config = GenerationConfig(max_active_requests=50)
    assert eng._megatron_max_requests() == 52  # megatron-core wants a multiple of the TP size


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


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["persist", "offload", "recompute"])
def test_dynamic_engine_parks_requests_across_a_train_step_on_gpu(mode):
    """Requests in flight at a suspend are kept (in every KV mode) and finish with their exact lengths."""

    from colo_fsm.adapters.megatron.dynamic import dynamic_engine_available

    ok, why = dynamic_engine_available()
    if not ok:
        pytest.skip(f"megatron-core's dynamic engine cannot run here: {why}")
    from colo_fsm.adapters.megatron.parallel import init_distributed
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout

    init_distributed(1, device="cuda")
    model = tiny(TOK, device="cuda", max_sequence_length=128, hidden_size=128, num_attention_heads=2)
    version = {"v": 0}
    eng = MegatronEngine(  # NOEND: the held request cannot end on end-of-document before its 4th token
        model, NOEND, GenerationConfig(kv_cache_mode=mode, buffer_size_gb=0.5), weight_version=lambda: version["v"]
    )
    eng.bring_up()
    lengths = [8, 16, 32, 48, 64, 96]
    started, hold = _hold_until_a_suspend(eng, after_tokens=4)  # forced: the 96-token request is mid-flight
    handles = [
        eng.submit(
            TOK.tokenize("123>"),
            max_tokens=n,
            temperature=1.0,
            top_k=5,
            stop_token_ids=(),
            on_token=hold if n == max(lengths) else None,
        )
        for n in lengths
    ]
    assert started.wait(120)
    doomed = eng.submit(TOK.tokenize("45>"), max_tokens=100)  # aborted while parked (stop-word hook / dequeue)
    eng.suspend()
    parked = eng.request_counts().parked
    steps = eng.steps
    MegatronTrainer(model).train_step([Rollout((1, 2), (3, 4), 1.0, 0), Rollout((1, 2), (4, 3), 0.0, 0)])
    version["v"] = 1
    assert eng.steps == steps and not eng.decode_in_flight
    assert doomed.cancel()
    eng.resume()
    outs = [h.result(timeout=300) for h in handles]
    for c, n in zip(outs, lengths):
        assert c.finish_reason in ("length", "stop") and (c.finish_reason == "stop" or len(c.token_ids) == n)
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)  # none missing (nan)
    assert parked > 0 and any(c.version_span == 1 for c in outs)
    assert doomed.result().finish_reason == "abort"
    eng.generate(["12>"], max_tokens=2)  # one more step lets the engine's bookkeeping release the aborted one
    assert eng.request_counts() == (0, 0, 0) and not eng._batcher.backend.engine.requests
    eng.shutdown()


def _hold_until_a_suspend(eng, *, after_tokens):
    """An ``on_token`` that, at a request's ``after_tokens``-th token, sets the returned event and holds the engine
    thread until a control call (the test's suspend) is on its way, once: that request is surely mid-flight at the
    suspend, whatever the machine's speed."""
    import threading

    reached = threading.Event()
    seen = []

    def hold(tok, lp, v):
        seen.append(tok)
        if len(seen) == after_tokens:
            reached.set()
            assert eng._batcher.wait_for_control(120), "no suspend came"

    return reached, hold


def _gpu_engine_or_skip(tokenizer=TOK, **cfg):
    from colo_fsm.adapters.megatron.dynamic import dynamic_engine_available

    ok, why = dynamic_engine_available()
    if not ok:
        pytest.skip(f"megatron-core's dynamic engine cannot run here: {why}")
    from colo_fsm.adapters.megatron.parallel import init_distributed

    init_distributed(1, device="cuda")
    model = tiny(TOK, device="cuda", max_sequence_length=128, hidden_size=128, num_attention_heads=2)
    version = {"v": 0}
    eng = MegatronEngine(
        model, tokenizer, GenerationConfig(buffer_size_gb=0.5, **cfg), weight_version=lambda: version["v"]
    )
    assert eng.backend_name == "dynamic"
    eng.bring_up()
    return model, eng, version


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["persist", "recompute"])
def test_dynamic_engine_abort_mode_resubmits_after_the_resume_on_gpu(mode):
    """inflight="abort" on megatron-core's engine: the request ended at the suspend is re-prefilled after the
    resume and completes with every token, versions per token, nothing left in the engine. The tokenizer's
    end-of-document id lies outside the vocabulary: a tiny random model sampling it would end the request before
    the suspend it waits for (what made this test fail on the GPU before, not the abort)."""

    model, eng, version = _gpu_engine_or_skip(NOEND, kv_cache_mode=mode, inflight="abort")
    reached, hold = _hold_until_a_suspend(eng, after_tokens=4)
    h = eng.submit(TOK.tokenize("123>"), max_tokens=48, temperature=1.0, top_k=5, on_token=hold)
    assert reached.wait(120)
    eng.suspend()
    assert eng.request_counts() == (1, 0, 0)  # ended in the engine, waiting for its resubmission
    version["v"] = 1
    eng.resume()
    c = h.result(timeout=300)
    assert c.finish_reason in ("length", "stop") and (c.finish_reason == "stop" or len(c.token_ids) == 48)
    assert c.weight_versions[:4] == (0,) * 4 and set(c.weight_versions[4:]) <= {1} and c.resubmissions == 1
    assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)  # none missing (nan)
    assert eng.inflight_stats() == (1, len(TOK.tokenize("123>")) + 4, 1, len(TOK.tokenize("123>")) + 4)
    lens = [10, 20, 30, 40, 50, 60]  # several ended at two suspends, each still gets exactly its length
    going, hold_longest = _hold_until_a_suspend(eng, after_tokens=2)  # forced: the 60-token one is mid-flight
    many = [
        eng.submit(
            TOK.tokenize("12>"), max_tokens=n, temperature=1.0, top_k=5, on_token=hold_longest if n == 60 else None
        )
        for n in lens
    ]
    assert going.wait(120)
    for v in (2, 3):
        eng.suspend()
        version["v"] = v
        eng.resume()
    outs = [h.result(timeout=300) for h in many]
    assert [len(o.token_ids) for o in outs] == lens and all(o.finish_reason == "length" for o in outs)
    assert all(len(o.logprobs) == len(o.token_ids) for o in outs)
    assert all(o.weight_versions == tuple(sorted(o.weight_versions)) for o in outs)
    assert eng.inflight_stats().ended > 1  # the first suspend ended the held request (and any other then running)
    eng.generate(["12>"], max_tokens=2)  # one more step lets the engine's bookkeeping release the ended row
    assert eng.request_counts() == (0, 0, 0) and not eng._batcher.backend.engine.requests
    eng.shutdown()


@pytest.mark.gpu
def test_dynamic_engine_processed_logprobs_give_ratio_one_at_temperature_2_on_gpu():
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig

    model, eng, _ = _gpu_engine_or_skip(logprobs_mode="processed")
    c = eng.submit(TOK.tokenize("3141>"), max_tokens=16, temperature=2.0).result(timeout=300)
    with pytest.raises(ConfigError):
        eng.submit(TOK.tokenize("1>"), max_tokens=2, logprobs_mode="raw")  # one mode for the whole engine
    eng.suspend()
    trainer = MegatronTrainer(model, TrainerConfig(temperature=2.0))
    ratios, comp = trainer.importance_ratios([Rollout(c.prompt_ids, c.token_ids, 0.0, 0, c.logprobs)])
    assert ratios[comp].tolist() == pytest.approx([1.0] * len(c.token_ids), abs=2e-2)
    eng.resume()
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


# -------------------------------------------------------------------------- the dynamic backend, in pieces
def _record(rid, *chunks, status="ACTIVE_AND_GENERATING_TOKENS"):
    """A stand-in ``DynamicInferenceRequestRecord``: one request per (tokens, logprobs) chunk (a recompute
    checkpoint starts a new request in the record)."""
    from types import SimpleNamespace

    reqs = [
        SimpleNamespace(generated_tokens=list(t), generated_log_probs=list(lp), status=SimpleNamespace(name=status))
        for t, lp in chunks
    ]

    class Rec(SimpleNamespace):
        def __getitem__(self, i):
            return self.requests[i]

    return Rec(request_id=rid, requests=reqs)


def test_dynamic_records_become_per_step_outputs_across_a_recompute_checkpoint():
    import math

    from colo_fsm.adapters.megatron.dynamic import RecordCursor, outputs_from_records, record_tokens

    eod = TOK.eod
    tracked = {1: RecordCursor(), 2: RecordCursor(), 3: RecordCursor()}
    live = {1: _record(1, ([5], [-0.5])), 2: _record(2, ([6], [-0.25])), 3: _record(3, ([7, 8], [-1.0]))}
    out = outputs_from_records(tracked, live, [], eod)
    assert [(o.request_id, o.token_ids, o.finished) for o in out] == [
        (1, (5,), None),
        (2, (6,), None),
        (3, (7, 8), None),
    ]
    assert math.isnan(out[2].logprobs[1])  # a missing log-prob is nan, never invented
    # request 1 was checkpointed (recompute resume): a second request in its record continues the tokens
    live = {1: _record(1, ([5], [-0.5]), ([4], [-0.1])), 3: live[3]}
    finished = [_record(2, ([6, eod], [-0.25, -0.3]), status="COMPLETED")]
    out = outputs_from_records(tracked, live, finished, eod)
    assert [(o.request_id, o.token_ids, o.logprobs, o.finished) for o in out] == [
        (1, (4,), (-0.1,), None),
        (2, (eod,), (-0.3,), "stop"),
    ]
    assert {r: c.reported for r, c in tracked.items()} == {1: 2, 3: 2}  # 2 left; 3 had nothing new
    failed = [_record(3, ([7, 8], [-1.0, -1.0]), status="FAILED")]
    assert [(o.request_id, o.finished) for o in outputs_from_records(tracked, {}, failed, eod)] == [(3, "abort")]
    assert record_tokens(_record(9, ([1, 2], [-1.0, -2.0]), ([3], [-3.0]))) == ([1, 2, 3], [-1.0, -2.0, -3.0])
    untracked = outputs_from_records({}, live, finished, eod)
    assert untracked == []  # an aborted request's late tokens are ignored


def test_dynamic_sampling_params_per_request():
    from colo_fsm.adapters.batching import BackendRequest
    from colo_fsm.adapters.megatron.dynamic import sampling_params

    g = sampling_params(BackendRequest(0, (1, 2), 7), eod=3)
    assert (g.top_k, g.temperature, g.top_p, g.num_tokens_to_generate, g.termination_id) == (1, 1.0, 0.0, 7, 3)
    assert g.return_log_probs and g.skip_prompt_log_probs
    s = sampling_params(BackendRequest(0, (1,), 5, temperature=0.7, top_p=0.9, top_k=4), eod=3)
    assert (s.temperature, s.top_p, s.top_k) == (0.7, 0.9, 4)
    assert sampling_params(BackendRequest(0, (1,), 5, temperature=1.0), eod=3).top_p == 0.0  # 1.0 means off


def test_dynamic_abort_dequeues_a_waiting_request_and_finishes_an_active_one():
    from collections import deque
    from types import SimpleNamespace

    from colo_fsm.adapters.megatron.dynamic import DynamicStepBackend, EngineIds, RecordCursor

    class Fut:
        def __init__(self):
            self.cancelled = False

        def done(self):
            return self.cancelled

        def cancel(self):
            self.cancelled = True

    be = object.__new__(DynamicStepBackend)  # the engine is the one piece stood in for (it needs a GPU)
    be.device = torch.device("cpu")
    waiting_future = Fut()
    be.engine = SimpleNamespace(
        waiting_request_ids=deque([2]),
        requests={1: SimpleNamespace(future=Fut()), 2: SimpleNamespace(future=waiting_future)},
        stop_word_finished_request_ids=set(),
        resume_request_ids=None,
        context=SimpleNamespace(),
    )
    be.ids = EngineIds()
    be.ids.add(7), be.ids.add(8)  # the engine's own ids of colo-fsm's requests 7 and 8 are 0 and 1
    be.engine.requests = {0: be.engine.requests[1], 1: be.engine.requests[2]}
    be.engine.waiting_request_ids = deque([1])
    be._tracked = {0: RecordCursor(offset=3, reported=3), 1: RecordCursor()}
    be._want_top = {0: 2}
    be.abort(8)
    assert 1 not in be.engine.requests and not be.engine.waiting_request_ids and waiting_future.cancelled
    be.abort(7)
    assert be.engine.stop_word_finished_request_ids == {0} and 0 in be.engine.requests  # finished next step
    be.abort(7)  # unknown now: a no-op
    assert be._tracked == {} and be._want_top == {} and len(be.ids) == 0


def test_cuda_graph_model_option():
    from colo_fsm.adapters.megatron.model import ModelConfig, transformer_config

    cfg = transformer_config(ModelConfig(vocab_size=16, device="cuda", cuda_graphs=True))
    assert cfg.cuda_graph_impl == "local" and cfg.inference_rng_tracker is True
    assert transformer_config(ModelConfig(vocab_size=16)).cuda_graph_impl == "none"
    with pytest.raises(ConfigError) as exc:
        ModelConfig(vocab_size=16, cuda_graphs=True)  # on the CPU
    assert exc.value.field == "cuda_graphs"
    assert GenerationConfig(num_cuda_graphs=16).num_cuda_graphs == 16


def test_offload_with_cuda_graphs_refuses_parking():
    """An offload resume recaptures the graphs over a reset context: parked requests would be lost."""
    with pytest.raises(ConfigError) as exc:
        GenerationConfig(kv_cache_mode="offload", num_cuda_graphs=16)  # inflight defaults to "park"
    assert exc.value.field == "kv_cache_mode" and "persist" in exc.value.expected
    assert GenerationConfig(kv_cache_mode="offload", num_cuda_graphs=16, inflight="drain").inflight == "drain"
    for mode in ("persist", "recompute"):
        assert GenerationConfig(kv_cache_mode=mode, num_cuda_graphs=16).num_cuda_graphs == 16
    assert GenerationConfig(kv_cache_mode="offload").kv_cache_mode == "offload"  # eager offload parks fine


# -------------------------------------------------------------------------- top log-probs
def test_top_logprobs_per_token_on_the_cpu_engine(model):
    import math

    eng = MegatronEngine(model, TOK, GenerationConfig(max_top_logprobs=5))
    eng.bring_up()
    try:
        seen = []
        h = eng.submit(
            TOK.tokenize("123>"), max_tokens=4, top_logprobs=3, on_token=lambda t, lp, v, top: seen.append(top)
        )
        c = h.result(timeout=60)
        assert len(c.top_logprobs) == len(c.token_ids) >= 1 and list(c.top_logprobs) == seen
        for tok, lp, top in zip(c.token_ids, c.logprobs, c.top_logprobs):
            assert len(top) == 3 and len({t for t, _ in top}) == 3
            assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)  # most likely first
            assert top[0] == (tok, pytest.approx(lp, abs=1e-6))  # greedy: the sampled token is the likeliest
            assert all(v <= 0 for _, v in top) and sum(math.exp(v) for _, v in top) <= 1 + 1e-6
        sampled = eng.submit(TOK.tokenize("123>"), max_tokens=4, temperature=1.0, seed=1, top_logprobs=5).result(60)
        for tok, lp, top in zip(sampled.token_ids, sampled.logprobs, sampled.top_logprobs):
            # the alternatives are untempered log-probs, like the sampled token's own
            assert len(top) == 5 and (tok not in dict(top) or dict(top)[tok] == pytest.approx(lp, abs=1e-6))
        plain = eng.submit(TOK.tokenize("123>"), max_tokens=2).result(60)  # not asked: nothing recorded
        assert plain.top_logprobs == () and len(plain.logprobs) == len(plain.token_ids)
        both = eng.generate_ids([TOK.tokenize("12>"), TOK.tokenize("45>")], max_tokens=3, top_logprobs=2)
        assert all(len(x.top_logprobs) == len(x.token_ids) and {len(t) for t in x.top_logprobs} == {2} for x in both)
        for bad in (-1, 6, True, 1.5):
            with pytest.raises(ConfigError) as exc:
                eng.submit(TOK.tokenize("1>"), max_tokens=1, top_logprobs=bad)
            assert exc.value.field == "top_logprobs" and "[0, 5]" in str(exc.value.expected)
        assert eng.request_counts() == (0, 0, 0)  # the refused requests disturbed nothing
    finally:
        eng.shutdown()
    with pytest.raises(ConfigError, match="max_top_logprobs"):
        GenerationConfig(max_top_logprobs=-1)
    assert GenerationConfig().max_top_logprobs == 20


def test_dynamic_top_n_logprobs_from_text_keyed_records():
    from colo_fsm.adapters.batching import BackendRequest
    from colo_fsm.adapters.megatron.dynamic import (
        RecordCursor,
        outputs_from_records,
        record_top_logprobs,
        sampling_params,
        token_text_index,
    )

    assert sampling_params(BackendRequest(0, (1,), 5, top_logprobs=4), eod=3).top_n_logprobs == 4
    assert sampling_params(BackendRequest(0, (1,), 5), eod=3).top_n_logprobs == 0
    index = token_text_index(TOK)
    assert index["7"] == TOK.tokenize("7")[0] and index[""] == TOK.eod  # specials share "": eod wins it
    five, six, seven = TOK.tokenize("567")

    def rec(rid, *chunks, status="ACTIVE_AND_GENERATING_TOKENS"):
        r = _record(rid, *[(t, lp) for t, lp, _ in chunks], status=status)
        for req, (_, _, tops) in zip(r.requests, chunks):
            req.generated_top_n_logprobs = tops  # megatron-core keys each token's top-n by the alternative's text
        return r

    r1 = rec(1, ([five], [-0.1], [{"6": -2.0, "5": -0.1}]), ([six], [-0.3], [{"6": -0.3, "": -1.5, "?": -3.0}]))
    assert record_top_logprobs(r1, index.get) == [((five, -0.1), (six, -2.0)), ((six, -0.3), (TOK.eod, -1.5))]
    short_tops = rec(2, ([five, six], [-0.1, -0.2], [{"5": -0.1}]))  # fewer entries than tokens: empty, not invented
    assert record_top_logprobs(short_tops, index.get) == [((five, -0.1),), ()]
    tracked = {1: RecordCursor(offset=1, reported=1), 2: RecordCursor(), 3: RecordCursor()}
    out = outputs_from_records(
        tracked,
        {1: r1, 2: short_tops, 3: rec(3, ([seven], [-0.5], [{"7": -0.5}]))},
        [],
        TOK.eod,
        want_top={1: 1, 2: 2},
        text_to_id=index.get,
    )
    tops = {o.request_id: o.top_logprobs for o in out}
    assert tops == {1: (((six, -0.3),),), 2: (((five, -0.1),), ()), 3: ()}  # cut to k; 3 asked for none
    assert [len(o.token_ids) for o in out] == [1, 2, 1]


def test_dynamic_seed_reseeds_the_engines_sampler_not_the_global_generator(monkeypatch):
    from types import SimpleNamespace

    from colo_fsm.adapters.batching import BackendRequest
    from colo_fsm.adapters.megatron.dynamic import DynamicStepBackend, EngineIds, RecordCursor

    class Fut:
        def done(self):
            return False

    be = object.__new__(DynamicStepBackend)  # the engine is stood in for (it needs a GPU)
    be.device = torch.device("cpu")
    be.eod = TOK.eod
    be._tracked, be._want_top, be.ids = {}, {}, EngineIds()
    be.logprobs_mode = "raw"
    be.sampling = None  # no replica stream: the request's seed as given
    rng = torch.Generator()
    added = []
    be.engine = SimpleNamespace(
        controller=SimpleNamespace(sampling_rng=rng),
        add_request=lambda rid, ids, sp: added.append((rid, sp.top_n_logprobs)) or Fut(),
    )
    touched = []
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda s: touched.append(s))
    be.add(BackendRequest(4, (1, 2), 3, temperature=1.0, seed=11, top_logprobs=2))
    expect = torch.Generator().manual_seed(11)
    assert torch.rand(3, generator=rng).tolist() == torch.rand(3, generator=expect).tolist()
    assert touched == [] and added == [(0, 2)] and be._want_top == {0: 2} and be._tracked == {0: RecordCursor()}
    assert be.ids.request_id(0) == 4
    from colo_fsm.guards.sampling import SamplingStream, mix_seed

    be.sampling = SamplingStream(7, dp_rank=1)  # a replica's stream: the seed is mixed with its DP rank
    be.add(BackendRequest(5, (1, 2), 3, temperature=1.0, seed=11))
    expect = torch.Generator().manual_seed(mix_seed(11, 1))
    assert torch.rand(3, generator=rng).tolist() == torch.rand(3, generator=expect).tolist()


def test_dynamic_engine_sees_dense_int32_ids_whatever_colo_fsm_ids_are():
    """megatron-core stores request ids in an int32 tensor: a resubmission's id (``inflight="abort"``) or a TP
    leader's fed request's id is far beyond that, so the backend hands the engine dense ids of its own and
    translates every output back (on the H200 the untranslated id overflowed: "value cannot be converted to type
    int without overflow")."""
    from colo_fsm.adapters.batching import StepOutput
    from colo_fsm.adapters.megatron.dynamic import DynamicStepBackend, EngineIds

    ids = EngineIds()
    huge = [(1 << 48) + 3, 5 + (2 << 40), 2**31 + 1]
    engine_ids = [ids.add(r) for r in huge]
    assert engine_ids == [0, 1, 2] and all(e < 2**31 for e in engine_ids)
    with pytest.raises(LifecycleError, match="already in the dynamic engine"):
        ids.add(huge[0])
    be = object.__new__(DynamicStepBackend)
    be.ids = ids
    out = be._as_requests([StepOutput(1, (3,), (-0.5,)), StepOutput(2, (4,), (-0.1,), "length")])
    assert [o.request_id for o in out] == huge[1:]
    assert ids.engine_id(huge[2]) is None and ids.engine_id(huge[1]) == 1 and len(ids) == 2


def test_abort_runs_on_the_dynamic_engine_without_an_opt_in(monkeypatch):
    """inflight="abort" passed its GPU tests on megatron-core's dynamic engine: it is no longer refused there, and
    the old opt-in is gone (a stale ``unverified_dynamic_abort=True`` is an error, not silently accepted)."""
    monkeypatch.setattr(MegatronEngine, "_choose_backend", lambda self: ("dynamic", "stand-in"))
    model = tiny(TOK)
    assert MegatronEngine(model, TOK, GenerationConfig(inflight="abort")).inflight.value == "abort"
    with pytest.raises(TypeError, match="unverified_dynamic_abort"):
        GenerationConfig(inflight="abort", unverified_dynamic_abort=True)  # type: ignore[call-arg]


def test_the_engine_switches_its_policy_only_when_idle(model):
    eng = MegatronEngine(model, TOK, GenerationConfig(inflight="park"))
    eng.set_inflight("abort")  # before bring_up: the config changes
    assert eng.config.inflight == "abort" and eng.inflight.value == "abort"
    with pytest.raises(ConfigError, match="inflight"):
        eng.set_inflight("later")
    eng.bring_up()
    eng.suspend()
    waiting = eng.submit(TOK.tokenize("12>"), max_tokens=2)
    with pytest.raises(LifecycleError, match="set_inflight"):
        eng.set_inflight("drain")
    assert eng.config.inflight == "abort"  # unchanged by the refused switch
    eng.resume()
    waiting.result(timeout=60)
    eng.set_inflight("drain")
    assert eng._batcher.inflight.value == "drain" and eng.inflight_stats() == (0, 0, 0, 0)
    eng.shutdown()


def test_length_buckets_cut_only_where_padding_costs_more_than_a_forward():
    from colo_fsm.adapters.megatron.cpu_loop import length_buckets

    assert length_buckets([]) == []
    close = [7, 8, 8, 9, 7, 8] * 10  # one step's rollouts: one forward
    assert length_buckets(close) == [sorted(range(60), key=lambda i: close[i])]
    mixed = [8] * 48 + [30] * 16  # rollouts and a few long HTTP requests: 64 x 30 padded, or 48 x 8 + 16 x 30
    groups = length_buckets(mixed)
    assert [sorted(g) for g in groups] == [list(range(48)), list(range(48, 64))]
    assert length_buckets(mixed, overhead=10_000) == [list(range(64))]  # not worth a forward
    assert len(length_buckets([1, 10, 100, 1000] * 8, overhead=0, most=3)) == 3


def test_the_cpu_loop_gives_each_row_the_logits_of_its_own_forward(model):
    """Rows split into length buckets get the logits a forward of the whole padded batch gives them."""
    from colo_fsm.adapters.batching import BackendRequest
    from colo_fsm.adapters.megatron.cpu_loop import CpuStepLoop, forward_logits, length_buckets

    loop = CpuStepLoop(model, eod=TOK.eod, pad=TOK.pad, max_sequence_length=64)
    loop.forward_overhead_tokens = 0  # cut wherever padding is saved
    prompts = [TOK.tokenize("12>")] * 6 + [TOK.tokenize("1234567890123456789012345678>")] * 2 + [TOK.tokenize("9>")]
    for i, ids in enumerate(prompts):
        loop.add(BackendRequest(request_id=i, prompt_ids=tuple(ids), max_tokens=2, temperature=0.0))
    assert len(length_buckets([len(p) for p in prompts], overhead=0)) == 3
    longest = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), longest), TOK.pad, dtype=torch.long)
    valid = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for i, ids in enumerate(prompts):
        tokens[i, longest - len(ids) :] = torch.tensor(ids)
        valid[i, longest - len(ids) :] = True
    with torch.no_grad():
        whole = forward_logits(model, tokens, valid)[:, -1, :]
        split = loop._last_logits()
    torch.testing.assert_close(split, whole, rtol=1e-4, atol=1e-4)
