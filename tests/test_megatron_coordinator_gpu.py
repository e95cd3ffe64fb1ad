"""megatron-core's coordinator mode for real (``pytest -m gpu``; one GPU; needs pyzmq and msgpack).

Bring-up once; requests parked across suspend -> train -> resume in persist and in recompute, each token
stamped with the weight version megatron recorded for it; a training step refused while megatron's engine runs;
a small MoE GPT (EP=1) that generates, trains after a resume with the mode guard checked before the training
forward, and generates again; the OpenAI-compatible server over the engine answering with the request fields
nemo-gym's RL path sends (nemo-gym itself needs Python 3.13, which the GPU machine lacks: the same fields are
posted here with the standard library's HTTP client).

pytest as the entry point is import-safe for megatron's spawned coordinator (``python -m pytest`` re-imports
``pytest.__main__``, which is guarded).
"""

from __future__ import annotations

import math
import os
import random
import time
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("zmq", reason="pyzmq (the coordinator extra)")
pytest.importorskip("msgpack", reason="msgpack (the coordinator extra)")

from colo_fsm.adapters.megatron.coordinator import CoordinatorConfig, CoordinatorEngine  # noqa: E402
from colo_fsm.adapters.megatron.mode import mode_control  # noqa: E402
from colo_fsm.adapters.megatron.model import ModelConfig, build_model  # noqa: E402
from colo_fsm.adapters.megatron.tokenizer import DEFAULT_ALPHABET, CharTokenizer  # noqa: E402
from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig  # noqa: E402
from colo_fsm.errors import EngineRebuild, EngineStateMismatch  # noqa: E402
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig  # noqa: E402

# end-of-document outside the model's vocabulary: every request runs to its requested length (greedy decoding of a
# random model would otherwise stop wherever it first picks eod); a plain class, so it pickles into megatron's
# coordinator process
TOK = CharTokenizer(DEFAULT_ALPHABET, generates_eod=False)
SEQ = 1024
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))


@pytest.fixture(scope="module")
def dist_cuda():
    from colo_fsm.adapters.megatron.parallel import init_distributed, shutdown_distributed

    setup = init_distributed(1, device="cuda")
    yield setup
    shutdown_distributed()


def _model(**kw: Any) -> Any:
    return build_model(
        ModelConfig(
            vocab_size=TOK.vocab_size,
            hidden_size=512,
            num_layers=4,
            num_attention_heads=8,
            max_sequence_length=SEQ,
            device="cuda",
            **kw,
        )
    )


@pytest.fixture(scope="module")
def dense(dist_cuda):
    return _model()


@pytest.fixture(scope="module")
def moe(dist_cuda):
    return _model(num_moe_experts=4, moe_router_topk=2)


def _rollouts(n: int = 8) -> list[Rollout]:
    rng = random.Random(0)
    return [
        Rollout(
            tuple(rng.randrange(3, 50) for _ in range(24)),
            tuple(rng.randrange(3, 50) for _ in range(48)),
            rng.random(),
            i // 4,
        )
        for i in range(n)
    ]


def _prompts(n: int, length: int = 32) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(3, 50) for _ in range(length)] for _ in range(n)]


class _Run:
    """A lifecycle over a coordinator engine and the real trainer on one model."""

    def __init__(self, model: Any, mode: str, inflight: str = "park") -> None:
        self.trainer = MegatronTrainer(
            model, TrainerConfig(lr=1e-3, backend="torch")
        )  # the adapter under test, not DDP
        self.box: dict[str, Lifecycle] = {}
        self.engine = CoordinatorEngine(
            model,
            TOK,
            CoordinatorConfig(
                kv_cache_mode=mode, buffer_size_gb=2.0, max_requests=64, control_timeout_s=120.0, inflight=inflight
            ),
            max_sequence_length=SEQ,
            weight_version=lambda: self.box["lc"].weight_version if "lc" in self.box else 0,
        )
        self.lc = Lifecycle(self.engine, self.trainer, None, config=LifecycleConfig())
        self.box["lc"] = self.lc


def _wait_decoding(engine: CoordinatorEngine, steps: int, timeout: float = 60.0) -> None:
    ctx = engine._llm.engine.context
    start = int(ctx.step_count)
    deadline = time.monotonic() + timeout
    while int(ctx.step_count) - start < steps:
        assert time.monotonic() < deadline, "the engine did not decode"
        time.sleep(0.005)


@pytest.mark.parametrize("mode", ["persist", "recompute"])
def test_park_across_suspend_train_resume_then_a_mismatch_is_refused(dense, mode: str) -> None:
    run = _Run(dense, mode)
    lc, eng = run.lc, run.engine
    lc.start()
    try:
        assert eng.native_state() == "RUNNING" and eng.loop_device == LOCAL_RANK
        with pytest.raises(EngineRebuild):
            eng.bring_up()
        lengths = [64, 128, 256, 384, 512, 640]
        handles = [eng.submit(p, max_tokens=n) for p, n in zip(_prompts(len(lengths)), lengths)]
        _wait_decoding(eng, 40)
        lc.step(_rollouts())
        assert lc.weight_version == 1
        outs = [h.result(timeout=180) for h in handles]
        for n, c in zip(lengths, outs):
            assert len(c.token_ids) == n and len(c.logprobs) == n and all(math.isfinite(x) for x in c.logprobs)
            assert len(c.weight_versions) == n and set(c.weight_versions) <= {0, 1}
            assert list(c.weight_versions) == sorted(c.weight_versions)
        spanning = [c for c in outs if c.version_span == 1]
        assert spanning, "no request spanned the training step (all finished before the pause?)"
        assert outs[-1].weight_versions[0] == 0 and outs[-1].weight_versions[-1] == 1
        states = [(r.trigger, r.engine_state) for r in lc.trace.records]
        assert ("begin_step", "SUSPENDED") in states and states[-1] == ("resume", "RUNNING")
        assert [t for t in eng.transitions[:4]] == [
            ("pause", "PAUSED"),
            ("suspend", "SUSPENDED"),
            ("resume", "PAUSED"),
            ("unpause", "RUNNING"),
        ]
        print(f"[{mode}] suspend/resume seconds: {eng.timings}")
        if mode == "persist":  # the same engine (a bring-up costs ~20 s here)
            # a pause lands a fixed few steps after it was asked at expert parallelism 1 (the signal's way through
            # megatron's coordinator: 4 in each of five handoffs on an H200 at 3385c87), where megatron's default
            # interval of 20 adds 0-19 steps drawn by where its consensus counter stands (about (5/20)**5 that five
            # such handoffs would all land within 8)
            assert eng.consensus_interval == 1
            more = [eng.submit(p, max_tokens=600) for p in _prompts(4)]
            for _ in range(4):
                _wait_decoding(eng, 10)
                lc.step(_rollouts())
            assert len(eng.pause_steps) == 5 and max(eng.pause_steps) <= 8, eng.pause_steps
            assert [len(h.result(timeout=180).token_ids) for h in more] == [600] * 4
            print(f"[{mode}] megatron's steps from asking the pause to SUSPENDED: {eng.pause_steps}")
            # a mismatch is refused by name
            steps = run.trainer.steps
            lc.begin_step()
            eng._call(eng._llm.resume(), "resume behind the lifecycle's back")
            eng._call(eng._llm.unpause(), "unpause behind the lifecycle's back")
            with pytest.raises(EngineStateMismatch) as info:
                lc.train(_rollouts())
            assert info.value.engine_state == "RUNNING" and info.value.lifecycle_state == "Training"
            assert run.trainer.steps == steps and lc.state.value == "Failed"
    finally:
        lc.stop()
    assert eng.native_state() == "STOPPED"


def test_abort_ends_requests_at_the_handoff_and_resubmits_them_after(dense) -> None:
    """inflight="abort" on megatron-core's own engine loop: the lifecycle's handoff ends the requests running in
    megatron's engine (its stop-word hook), and after the training step each is re-prefilled as prompt + its
    tokens and runs to exactly its length, its tokens stamped with the version that made them."""
    run = _Run(dense, "persist", inflight="abort")
    lc, eng = run.lc, run.engine
    lc.start()
    try:
        lengths = [96, 192, 320, 448]
        handles = [eng.submit(p, max_tokens=n) for p, n in zip(_prompts(len(lengths)), lengths)]
        _wait_decoding(eng, 40)
        lc.step(_rollouts())
        stats = eng.inflight_stats()
        assert stats.ended == len(lengths) and stats.discarded_tokens > len(lengths) * 32
        outs = [h.result(timeout=180) for h in handles]
        for n, c in zip(lengths, outs):
            assert len(c.token_ids) == n and len(c.logprobs) == n and all(math.isfinite(x) for x in c.logprobs)
            assert c.resubmissions == 1 and c.weight_versions[0] == 0 and c.weight_versions[-1] == 1
            assert list(c.weight_versions) == sorted(c.weight_versions)
        assert eng.inflight_stats().reprefills == len(lengths) and eng.request_counts() == (0, 0, 0)
    finally:
        lc.stop()


def test_moe_generates_trains_after_a_resume_and_generates_again(moe) -> None:
    control = mode_control(moe)
    assert control.moe, "the model has no MoE layers"
    run = _Run(moe, "persist")
    lc, eng, trainer = run.lc, run.engine, run.trainer
    seen_modes: list[list[Any]] = []
    inner_step = trainer.train_step

    def checked_step(batch: Any) -> Any:
        seen_modes.append(control.report().off_training())  # what the mode guard checked before the forward
        return inner_step(batch)

    trainer.train_step = checked_step  # type: ignore[method-assign]
    lc.start()
    try:
        before = eng.generate_ids(_prompts(4), max_tokens=24)
        handles = [eng.submit(p, max_tokens=300) for p in _prompts(4, 40)]
        _wait_decoding(eng, 20)
        for _ in range(2):
            result = lc.step(_rollouts())
            assert math.isfinite(result.metrics["train/loss"])
        after = eng.generate_ids(_prompts(4), max_tokens=24)
        outs = [h.result(timeout=180) for h in handles]
        assert seen_modes == [[], []]
        assert all(len(c.token_ids) == 300 for c in outs) and max(c.version_span for c in outs) >= 1
        assert all(len(c.token_ids) == 24 for c in before + after)
        assert after[0].weight_versions[0] == 2
    finally:
        lc.stop()


def _post(url: str, body: dict[str, Any], *, stream: bool = False) -> Any:
    """POST JSON with the standard library (the GPU machine has no HTTP client package)."""
    import json
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=180) as r:
        if stream:
            return [line.decode().strip() for line in r if line.strip()]
        return json.loads(r.read())


def test_openai_server_over_the_coordinator_gives_token_ids_and_logprobs(dense) -> None:
    from colo_fsm.server import GatedEngine
    from colo_fsm.server.templates import digits_chat_template  # the character tokenizer has no newline

    eng = CoordinatorEngine(dense, TOK, CoordinatorConfig(buffer_size_gb=1.0), max_sequence_length=SEQ)
    gated = GatedEngine(
        eng, eng, serve=True, request_timeout_s=60.0, model_name="coord", chat_template=digits_chat_template
    )
    gated.bring_up()
    try:
        (base,) = gated.server_base_urls()
        prompt = "12+34="
        assert _post(base.removesuffix("/v1") + "/tokenize", {"model": "coord", "prompt": prompt})["tokens"] == (
            TOK.tokenize(prompt)
        )
        # the fields nemo-gym's RL path sends (VLLMModel, return_token_id_information=True, completions API)
        r = _post(
            base + "/completions",
            {
                "model": "coord",
                "prompt": prompt,
                "max_tokens": 8,
                "temperature": 1.0,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
            },
        )
        c = r["choices"][0]
        assert c["prompt_token_ids"] == TOK.tokenize(prompt)
        assert len(c["token_ids"]) == len(c["logprobs"]["token_logprobs"]) > 0
        assert all(t.startswith("token_id:") for t in c["logprobs"]["tokens"])
        # and its chat call (logprobs=True, top_logprobs=0)
        chat = _post(
            base + "/chat/completions",
            {
                "model": "coord",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 8,
                "temperature": 1.0,
                "logprobs": True,
                "top_logprobs": 0,
            },
        )
        assert len(chat["choices"][0]["logprobs"]["content"]) > 0
        # streaming: megatron-core 0.19.2 answers once per request, so the chunks arrive together at its end
        lines = _post(
            base + "/completions", {"model": "coord", "prompt": prompt, "max_tokens": 8, "stream": True}, stream=True
        )
        assert lines[-1] == "data: [DONE]" and len(lines) >= 3
    finally:
        gated.shutdown()
