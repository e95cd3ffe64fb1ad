"""The coordinator-mode adapter on a scripted stand-in of megatron-core's ``MegatronAsyncLLM`` surface (CPU).

What is checked: megatron's own handoff (pause -> PAUSED -> suspend -> SUSPENDED, resume -> RESUMED ->
unpause -> RUNNING) under the lifecycle with requests parked across a training step and their per-token weight
versions read from ``policy_epoch``; the lifecycle refusing a training step while megatron's engine runs
(naming both states) and recording the engine's state in the trace; every pending request failing at once
when the engine loop dies; the spawn/import-safety refusal; request validation; the docs' state table. The
real engine runs in ``tests/test_megatron_coordinator_gpu.py`` (``-m gpu``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from colo_fsm.adapters.engine.options import InflightPolicy
from colo_fsm.adapters.megatron.coordinator import SPAWN_HINT, CoordinatorConfig, CoordinatorEngine
from colo_fsm.adapters.megatron.coordinator_states import state_table, token_versions
from colo_fsm.adapters.megatron.step_profile import window
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.errors import (
    ConfigError,
    EngineLoopDied,
    EngineRebuild,
    EngineStateMismatch,
    LifecycleError,
    RequestTooLarge,
)
from colo_fsm.guards.drain import NoDeviceDrain
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.spec import LIFECYCLE, EngineCondition
from colo_fsm.testing.fakes import RecordingCollector, RecordingTrainer

pytest.importorskip("megatron.core.inference.sampling_params", reason="megatron-core (the megatron extra)")
from _coordinator_fake import FakeAsyncLLM
from _megatron_util import dist1  # noqa: F401

from colo_fsm.adapters.megatron.model import ModelConfig
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[1]


class TinyModel(torch.nn.Module):
    """Just what the adapter reads off a model: parameters (device), config (parallel sizes), max length."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(4, 4)
        self.config = types.SimpleNamespace(tensor_model_parallel_size=1)
        self.max_sequence_length = 64


def make(inflight: str = "park", **kw: Any) -> tuple[CoordinatorEngine, dict[str, int]]:
    version = {"v": 0}
    eng = CoordinatorEngine(
        TinyModel(),
        CharTokenizer(),
        CoordinatorConfig(watch_interval_s=0.01, control_timeout_s=30.0, inflight=inflight),
        weight_version=lambda: version["v"],
        llm_factory=FakeAsyncLLM,
        **kw,
    )
    return eng, version


def fake(eng: CoordinatorEngine) -> Any:
    return eng._llm


@pytest.fixture
def engine():
    eng, version = make()
    yield eng, version
    eng.shutdown()


# ---------------------------------------------------------------------------------------------- pure pieces
def test_token_versions_follow_policy_epoch_boundaries() -> None:
    # prompt of 4; 3 tokens generated under epoch 0, then epoch 1 set: boundary at the last token (index 6)
    assert token_versions([(0, 0), (6, 1)], 4, 6, sent=[0, 1]) == (0, 0, 0, 1, 1, 1)
    assert token_versions([(0, 2)], 4, 2) == (2, 2)
    assert token_versions(None, 4, 0) == ()
    with pytest.raises(LifecycleError, match="without policy_epoch"):
        token_versions(None, 4, 3, request_id=7)
    with pytest.raises(LifecycleError, match=r"stamps \[5\] were never set"):
        token_versions([(0, 0), (6, 5)], 4, 6, sent=[0, 1])
    with pytest.raises(LifecycleError, match="backwards"):
        token_versions([(0, 1), (6, 0)], 4, 6)


def test_docs_show_the_state_mapping_read_from_the_spec() -> None:
    text = (ROOT / "docs" / "coordinator.md").read_text()
    for state, cond, natives in state_table(LIFECYCLE):
        want = ", ".join(natives) if natives else "-"
        row = re.search(rf"^\| {state.value} \| {cond.value} \| ([^|]+) \|", text, re.M)
        assert row is not None, f"docs/coordinator.md has no row for {state.value}"
        assert row.group(1).strip() == want, (state, row.group(1), want)


# ---------------------------------------------------------------------------------------------- the handoff
def test_park_across_suspend_train_resume_records_versions_and_engine_states(engine) -> None:
    eng, version = engine
    trainer = RecordingTrainer()
    lc = Lifecycle(eng, trainer, RecordingCollector(), config=LifecycleConfig(num_steps=3), drain=NoDeviceDrain())
    eng._weight_version = lambda: lc.weight_version
    lc.start()
    llm = fake(eng)
    llm.engine.allow_steps = 0  # no decode step until all four requests are in (none may start late)
    handles = [eng.submit([5, 6, 7, 8], max_tokens=8) for _ in range(4)]
    wait_until(lambda: len(llm.engine.requests) == 4, "four requests in the engine")
    assert llm.engine.steps == 0
    llm.engine.allow_steps = 3  # exactly three decode steps, every request in each, before the handoff
    wait_until(lambda: llm.engine.steps == 3, "three decode steps")
    steps_at_train: list[int] = []

    def train_step(batch: Any) -> Any:
        llm.engine.allow_steps = None  # would decode now if the engine were not suspended
        time.sleep(0.05)
        steps_at_train.append(llm.engine.steps)
        assert eng.native_state() == "SUSPENDED"
        return RecordingTrainer.train_step(trainer, batch)

    trainer.train_step = train_step  # type: ignore[method-assign]
    lc.step([1, 2])
    outs = [h.result(timeout=20) for h in handles]
    assert steps_at_train == [3]  # no decode step while the lifecycle trained
    for c in outs:
        assert len(c.token_ids) == 8 and c.finish_reason == "length"
        assert c.weight_versions == (0, 0, 0, 1, 1, 1, 1, 1) and c.version_span == 1
        assert c.logprobs == (-0.25,) * 8
    assert [t for t in eng.transitions] == [
        ("pause", "PAUSED"),
        ("suspend", "SUSPENDED"),
        ("resume", "PAUSED"),
        ("unpause", "RUNNING"),
    ]
    assert eng.epochs_sent == [0, 1] and llm._coord_runtime.client.epochs == [0, 1]
    states = {(r.trigger, r.dest): r.engine_state for r in lc.trace.records}
    assert states[("start", "Starting")] == "RUNNING"
    assert states[("begin_step", "Draining")] == "SUSPENDED"
    assert states[("train", "Training")] == "SUSPENDED"
    assert states[("resume", "Generating")] == "RUNNING"
    lc.stop()
    assert eng.native_state() == "STOPPED" and eng.engine_state().condition is EngineCondition.TORN_DOWN


def test_a_training_step_is_refused_while_the_engine_runs_naming_both_states(engine) -> None:
    eng, _ = engine
    trainer = RecordingTrainer()
    lc = Lifecycle(eng, trainer, RecordingCollector(), config=LifecycleConfig(num_steps=3), drain=NoDeviceDrain())
    lc.start()
    lc.begin_step()
    assert eng.native_state() == "SUSPENDED"
    llm = fake(eng)
    eng._call(llm.resume(), "resume behind the lifecycle's back")
    eng._call(llm.unpause(), "unpause behind the lifecycle's back")
    assert eng.native_state() == "RUNNING"
    with pytest.raises(EngineStateMismatch) as info:
        lc.train([1, 2])
    err = info.value
    assert err.lifecycle_state == "Training" and err.expected == "suspended" and err.engine_state == "RUNNING"
    assert "Training" in str(err) and "RUNNING" in str(err) and "SUSPENDED" in str(err)
    assert trainer.steps == 0 and lc.state.value == "Failed"
    lc.stop()  # the local teardown after a failure runs whatever state the engine was left in
    assert lc.state.value == "Stopped" and eng.native_state() == "STOPPED"


def test_a_suspend_that_leaves_the_engine_running_is_caught_after_the_action(engine) -> None:
    eng, _ = engine
    lc = Lifecycle(eng, RecordingTrainer(), RecordingCollector(), config=LifecycleConfig(), drain=NoDeviceDrain())
    lc.start()
    eng.suspend = lambda: None  # type: ignore[method-assign]  # a broken adapter: returns, engine still RUNNING
    with pytest.raises(EngineStateMismatch, match="after suspend_engine"):
        lc.begin_step()
    assert lc.state.value == "Failed"


# ---------------------------------------------------------------------------------------------- loop death
def test_engine_loop_death_fails_every_pending_request_at_once(engine) -> None:
    eng, _ = engine
    eng.bring_up()
    llm = fake(eng)
    llm.engine.allow_steps = 0  # nothing finishes
    handles = [eng.submit([5, 6, 7], max_tokens=4) for _ in range(3)]
    wait_until(lambda: len(llm.engine.requests) == 3, "three requests admitted")
    llm.engine.die_with = AssertionError("Prompt log probs cannot be calculated")  # megatron's add_request assert
    done, not_done = concurrent.futures.wait([h.future for h in handles], timeout=20)
    assert not not_done, f"{len(not_done)} request(s) still waiting after the engine loop died"
    for h in handles:
        err = h.future.exception()
        assert isinstance(err, EngineLoopDied) and "AssertionError" in str(err) and err.pending == 3
    with pytest.raises(EngineLoopDied):
        eng.submit([5], max_tokens=2)
    with pytest.raises(EngineLoopDied):
        eng.suspend()
    report = eng.engine_state()
    assert report is not None and report.condition is EngineCondition.TORN_DOWN and "loop ended" in report.native


def test_loop_death_during_a_suspend_raises_instead_of_waiting(engine) -> None:
    eng, _ = engine
    eng.bring_up()
    llm = fake(eng)
    llm.engine.die_with = RuntimeError("boom")
    with pytest.raises(EngineLoopDied, match="RuntimeError: boom"):
        eng.suspend()


# ---------------------------------------------------------------------------------------------- bring-up, input
def test_spawned_child_reimporting_the_entry_script_is_refused(monkeypatch) -> None:
    eng, _ = make()
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__name__="__mp_main__", __file__="run.py"))
    with pytest.raises(ConfigError) as info:
        eng.bring_up()
    assert info.value.field == "__main__" and info.value.value == "run.py" and "spawn" in str(info.value)
    assert not eng.built


def test_coordinator_process_exiting_at_start_up_names_import_safety() -> None:
    def factory(**_: Any) -> Any:
        raise RuntimeError("Process SpawnProcess-1 (pid 4242) has exited unexpectedly.")

    eng = CoordinatorEngine(TinyModel(), CharTokenizer(), llm_factory=factory)
    with pytest.raises(ConfigError, match=re.escape(SPAWN_HINT)) as info:
        eng.bring_up()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_built_once_and_bad_requests_are_refused_by_name(engine) -> None:
    eng, _ = engine
    with pytest.raises(LifecycleError, match="before bring_up"):
        eng.submit([1, 2], max_tokens=2)
    eng.bring_up()
    with pytest.raises(EngineRebuild):
        eng.bring_up()
    eng.resume()  # already RUNNING: a no-op (megatron ignores RESUME there and would never answer the wait)
    assert eng.transitions == [] and eng.epochs_sent == [0]
    with pytest.raises(ConfigError, match="top_logprobs"):
        eng.submit([5, 6], max_tokens=2, top_logprobs=3)
    with pytest.raises(ConfigError, match="logprobs_mode='processed'"):
        eng.submit([5, 6], max_tokens=2, logprobs_mode="processed")
    assert fake(eng).inference_config.logprobs_mode == "raw_logprobs"
    with pytest.raises(RequestTooLarge):
        eng.submit([5] * 60, max_tokens=8)
    with pytest.raises(ConfigError, match="prompt_ids"):
        eng.submit([], max_tokens=2)
    # sampling values as every engine checks them: a temperature that is not a finite number went to megatron
    for bad in (
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_p": 0.0},
        {"top_k": -1},
        {"seed": -3},
        {"max_tokens": 0},
    ):
        field = next(iter(bad))
        with pytest.raises(ConfigError) as info:
            eng.submit([5, 6], **{"max_tokens": 2, **bad})
        assert info.value.field == field, bad
    assert sum(eng.request_counts()) == 0, "a refused request was sent"
    follower, _ = make(rank=1)
    follower.bring_up()
    try:
        with pytest.raises(ConfigError, match="rank=1"):
            follower.submit([5, 6], max_tokens=2)
    finally:
        follower.shutdown()
    with pytest.raises(ConfigError, match="kv_cache_mode"):
        CoordinatorConfig(kv_cache_mode="offload", num_cuda_graphs=8)


def test_on_token_stop_ids_cancel_and_seed_are_applied_or_counted(engine) -> None:
    eng, _ = engine
    eng.bring_up()
    seen: list[tuple[int, float, int]] = []

    def on_token(t: int, lp: float, v: int) -> bool | None:
        seen.append((t, lp, v))
        return False if len(seen) == 2 else None

    a = eng.submit([5, 6], max_tokens=6, on_token=on_token).result(timeout=20)
    assert len(a.token_ids) == 2 and a.finish_reason == "stop" and [s[0] for s in seen] == list(a.token_ids)
    full = eng.submit([5, 6], max_tokens=6).result(timeout=20)
    b = eng.submit([5, 6], max_tokens=6, stop_token_ids=[full.token_ids[2]]).result(timeout=20)
    assert b.token_ids == full.token_ids[:3] and b.finish_reason == "stop"
    llm = fake(eng)
    llm.engine.allow_steps = 0
    h = eng.submit([5, 6], max_tokens=3)
    assert h.cancel() and h.result().finish_reason == "abort" and not h.cancel()
    llm.engine.allow_steps = None
    wait_until(lambda: eng.cancelled_still_decoding == 1, "the cancelled request's reply to be dropped")
    eng.submit([5, 6], max_tokens=2, temperature=1.0, seed=3).result(timeout=20)
    assert eng.seeds_not_applied == 1


# ---------------------------------------------------------------------------------------------- the server
def test_server_over_the_coordinator_engine_keeps_the_gym_contract() -> None:
    import httpx

    from colo_fsm.server import GatedEngine
    from colo_fsm.server.templates import digits_chat_template

    eng, _ = make()
    gated = GatedEngine(
        eng, eng, serve=True, request_timeout_s=20.0, model_name="coord", chat_template=digits_chat_template
    )
    gated.bring_up()
    try:
        (base,) = gated.server_base_urls()
        tok = CharTokenizer()
        r = httpx.post(
            base + "/completions",
            json={"prompt": "12+3=", "max_tokens": 5, "logprobs": 0, "return_tokens_as_token_ids": True},
            timeout=20,
        ).json()
        c = r["choices"][0]
        assert c["prompt_token_ids"] == tok.tokenize("12+3=") and len(c["token_ids"]) == 5
        assert c["logprobs"]["token_logprobs"] == [-0.25] * 5
        assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
        assert httpx.post(base + "/tokenize", json={"prompt": "12"}, timeout=20).json()["tokens"] == tok.tokenize("12")
        with httpx.stream(
            "POST", base + "/completions", json={"prompt": "12", "max_tokens": 4, "stream": True}, timeout=20
        ) as s:
            events = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        chat = httpx.post(
            base + "/chat/completions",
            json={
                "messages": [{"role": "user", "content": "12"}],
                "max_tokens": 3,
                "temperature": 1.0,
                "logprobs": True,
                "top_logprobs": 0,
            },
            timeout=20,
        ).json()
        assert len(chat["choices"][0]["logprobs"]["content"]) == 3
        bad = httpx.post(base + "/completions", json={"prompt": "1", "max_tokens": 2, "logprobs": 3}, timeout=20)
        assert bad.status_code == 400 and "logprobs" in bad.text
        # any integer seed is taken (HTTP seeds may be negative): each prompt's is folded into [0, 2**63), on the
        # token path and the text path alike (the text path passed seed + i to the engine, which refuses < 0)
        seeded = {"prompt": "12", "max_tokens": 2, "temperature": 1.0, "seed": -5}
        assert httpx.post(base + "/completions", json=seeded, timeout=20).status_code == 200
        outs = gated.generate(["12", "34"], max_tokens=2, temperature=1.0, seed=-1)
        assert [len(o.token_ids) for o in outs] == [2, 2]
    finally:
        gated.shutdown()


def test_an_engine_left_between_two_of_its_states_is_a_mismatch(engine) -> None:
    eng, _ = engine
    lc = Lifecycle(eng, RecordingTrainer(), RecordingCollector(), config=LifecycleConfig(), drain=NoDeviceDrain())
    lc.start()
    llm = fake(eng)
    eng.suspend = lambda: eng._call(llm.pause(), "pause only")  # type: ignore[method-assign]
    with pytest.raises(EngineStateMismatch) as info:
        lc.begin_step()
    assert info.value.engine_state == "PAUSED" and info.value.engine_condition == "between two conditions"
    assert "SUSPENDED" in str(info.value)


def test_the_gated_server_engine_passes_the_engine_state_through(engine) -> None:
    from colo_fsm.server import GatedEngine

    eng, _ = engine
    gated = GatedEngine(eng, eng)
    lc = Lifecycle(gated, RecordingTrainer(), RecordingCollector(), config=LifecycleConfig(), drain=NoDeviceDrain())
    lc.start()
    lc.begin_step()
    assert [(r.trigger, r.engine_state) for r in lc.trace.records] == [
        ("start", "RUNNING"),
        ("generate", "RUNNING"),
        ("begin_step", "SUSPENDED"),
    ]
    llm = fake(eng)
    eng._call(llm.resume(), "resume behind the lifecycle's back")
    with pytest.raises(EngineStateMismatch, match="reports PAUSED"):
        lc.train([1])


# ---------------------------------------------------------------------------------------------- the MoE model
def test_moe_model_config_is_checked_by_name() -> None:
    with pytest.raises(ConfigError, match="moe_router_topk"):
        ModelConfig(num_moe_experts=2, moe_router_topk=3)
    with pytest.raises(ConfigError, match="expert_model_parallel_size"):
        ModelConfig(num_moe_experts=4, expert_model_parallel_size=3)
    with pytest.raises(ConfigError, match="expert_model_parallel_size"):
        ModelConfig(expert_model_parallel_size=2)


def test_moe_gpt_on_the_cpu_has_expert_layers_in_the_training_mode(dist1) -> None:  # noqa: F811
    from colo_fsm.adapters.megatron.mode import MegatronModeControl
    from colo_fsm.adapters.megatron.model import build_model

    tok = CharTokenizer()
    model = build_model(
        ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_attention_heads=4, num_moe_experts=4)
    )
    control = MegatronModeControl(model)
    assert len(control.moe) == 2 and control.report().off_training() == []
    assert control.read().expert_padding is False and model.config.moe_router_topk == 2


def test_engine_paths_bench_compares_mode_by_mode() -> None:
    from bench.engine_paths import compare, step_wall_ms

    row = {
        "samples_per_s": 2.0,
        "decode_steps_per_s": 50.0,
        "engine_idle_share": 0.5,
        "handoff_p50_ms": 1.0,
        "measured_steps": 3,
    }
    assert step_wall_ms(row) == pytest.approx(10.0) and math.isnan(step_wall_ms({"decode_steps_per_s": 0}))
    faster = {**row, "samples_per_s": 3.0, "decode_steps_per_s": 100.0}
    one_step = {**row, "measured_steps": 1}
    out, no_ratio = compare(
        {
            "direct": {"modes": {"park": row, "drain": row, "abort": {"skipped": "x"}}},
            "coordinator": {"modes": {"park": faster, "drain": one_step}},
        }
    )
    assert list(out) == ["park"]
    assert out["park"]["ratio_samples_per_s"] == pytest.approx(1.5) and out["park"]["ratio_step_wall_ms"] == 0.5
    assert no_ratio == {
        "drain": "coordinator drain has 1 measured step(s), fewer than 3",
        "abort": "direct abort did not run (x)",
    }


def test_server_traffic_holds_at_most_its_share_of_the_engine() -> None:
    from colo_fsm.adapters.batching import Priority

    eng = CoordinatorEngine(
        TinyModel(),
        CharTokenizer(),
        CoordinatorConfig(max_requests=4, server_share=0.5, watch_interval_s=0.01),
        llm_factory=FakeAsyncLLM,
    )
    eng.bring_up()
    try:
        llm = fake(eng)
        llm.engine.allow_steps = 0  # nothing finishes until the interleaving below is in place
        server = [eng.submit([5, 6], max_tokens=3, priority=Priority.SERVER) for _ in range(4)]
        rollouts = [eng.submit([7, 8], max_tokens=3, priority=Priority.TRAINING) for _ in range(2)]
        wait_until(lambda: len(llm.engine.requests) + len(eng.server_share.waiting) == 6, "all six accounted for")
        assert eng.server_share.in_engine == 2 and len(eng.server_share.waiting) == 2
        assert sum(1 for r in llm.engine.requests.values() if r.prompt_tokens == [7, 8]) == 2
        assert server[3].cancel()  # cancelled while waiting for a slot: it never reaches the engine
        llm.engine.allow_steps = None
        outs = [h.result(timeout=20) for h in server[:3] + rollouts]
        assert all(len(c.token_ids) == 3 for c in outs) and server[3].result().finish_reason == "abort"
        wait_until(lambda: eng.server_share.in_engine == 0, "every server slot released")
        assert eng.server_share.held == 2 and llm._next == 5  # five requests ever reached megatron's engine
    finally:
        eng.shutdown()


def test_the_fixed_length_tokenizer_pickles_into_the_coordinator_process() -> None:
    import pickle

    tok = pickle.loads(pickle.dumps(CharTokenizer("0123>", generates_eod=False)))
    assert tok.eod == tok.vocab_size == 8 and tok.tokenize("1>") == [4, 7] and tok.alphabet == "0123>"
    assert CharTokenizer("0123>").eod == 2


# ---------------------------------------------------------------------------------------------- in-flight policies
def _suspend_resume(eng: CoordinatorEngine, version: dict[str, int], to: int) -> None:
    eng.suspend()
    version["v"] = to
    eng.resume()


def _abort_after_steps(eng: CoordinatorEngine, llm: Any, requests: list[tuple[list[int], int]], steps: int) -> list:
    """Submit ``requests`` (prompt, max_tokens) with megatron's steps held, let exactly ``steps`` decode steps run,
    then suspend (abort) with no decode step between the last of them and the abort's stop words (forced: a free
    engine could decode another token, or finish a request, before a late suspend reached it, as it did once on a
    loaded machine); then the stop-word step the abort waits for runs and the suspend returns. The handles."""
    llm.engine.allow_steps = 0
    handles = [eng.submit(prompt, max_tokens=n) for prompt, n in requests]
    wait_until(lambda: len(llm.engine.requests) == len(requests), "every request in megatron's engine")
    llm.engine.allow_steps = steps
    wait_until(lambda: llm.engine.steps == steps, f"{steps} decode steps")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        suspended = pool.submit(eng.suspend)
        wait_until(lambda: len(llm.engine.stop_word_finished_request_ids) == len(requests), "the abort's stop words")
        assert llm.engine.steps == steps and not suspended.done()
        llm.engine.allow_steps = None
        suspended.result(timeout=20)
    return handles


def test_abort_ends_the_running_requests_and_resubmits_prompt_plus_tokens_after_the_resume() -> None:
    """inflight="abort" on the coordinator path: megatron's stop-word hook ends the requests running at the suspend
    (no per-request abort in megatron-core 0.19.2); after the resume each goes back as prompt + the tokens it had
    with the rest of its max_tokens, and its caller gets one completion with every token and its version."""
    eng, version = make("abort")
    eng.bring_up()
    try:
        llm = fake(eng)
        handles = _abort_after_steps(eng, llm, [([5, 6, 7, 8], 10), ([5, 6, 7, 8], 6)], 3)
        assert not llm.engine.requests, "the suspend left requests in megatron's engine"
        assert eng.request_counts() == (2, 0, 0)  # both wait for their resubmission
        assert eng.inflight_stats() == (2, 2 * (4 + 3), 0, 0)  # prompt + 3 tokens of KV each, discarded
        assert not any(h.done() for h in handles)
        version["v"] = 1
        eng.resume()
        wait_until(lambda: all(h.done() for h in handles), "every ended request answered after the resume")
        outs = [h.result() for h in handles]
        assert [len(c.token_ids) for c in outs] == [10, 6] and all(c.finish_reason == "length" for c in outs)
        assert outs[0].weight_versions == (0, 0, 0) + (1,) * 7 and outs[1].weight_versions == (0, 0, 0, 1, 1, 1)
        assert all(c.resubmissions == 1 and c.prompt_ids == (5, 6, 7, 8) for c in outs)
        # the continuation is what the engine makes from prompt + tokens so far (the fake's tokens follow position)
        assert outs[0].token_ids == tuple(3 + (4 + i) % 20 for i in range(10))
        assert eng.inflight_stats() == (2, 14, 2, 14) and eng.request_counts() == (0, 0, 0)
    finally:
        eng.shutdown()


def test_a_request_cancelled_while_waiting_for_its_resubmission_is_never_sent_again() -> None:
    eng, version = make("abort")
    eng.bring_up()
    try:
        llm = fake(eng)
        (h,) = _abort_after_steps(eng, llm, [([5, 6], 10)], 2)
        carried = len(h.carry.token_ids)
        assert carried == 2 and h.cancel()
        assert h.result().finish_reason == "abort" and len(h.result().token_ids) == carried
        sent = llm._next
        _suspend_resume(eng, version, 1)  # the resume resubmits nothing for it
        eng.resume()
        assert llm._next == sent and eng.request_counts() == (0, 0, 0)
        assert eng.inflight_stats().reprefills == 0
    finally:
        eng.shutdown()


def test_drain_waits_for_every_answer_before_the_pause() -> None:
    eng, version = make("drain")
    eng.bring_up()
    try:
        llm = fake(eng)
        handles = [eng.submit([5, 6], max_tokens=n) for n in (3, 30)]
        wait_until(lambda: llm.engine.steps >= 1, "a decode step")
        eng.suspend()
        assert all(h.done() for h in handles), "a drain-mode suspend returned with requests unanswered"
        assert [len(h.result().token_ids) for h in handles] == [3, 30] and eng.inflight_stats().ended == 0
        eng.resume()
    finally:
        eng.shutdown()


def test_the_policy_switches_only_while_no_request_is_pending() -> None:
    eng, _ = make()
    eng.bring_up()
    try:
        llm = fake(eng)
        llm.engine.allow_steps = 0
        h = eng.submit([5, 6], max_tokens=2)
        with pytest.raises(LifecycleError, match=r"set_inflight\('abort'\) with 1 request"):
            eng.set_inflight("abort")
        llm.engine.allow_steps = None
        h.result(timeout=20)
        wait_until(lambda: eng.request_counts() == (0, 0, 0), "the reply handled")
        eng.set_inflight("abort")
        assert eng.inflight.value == "abort" and eng.config.inflight == "abort"
        with pytest.raises(ConfigError, match="inflight"):
            eng.set_inflight("sometimes")
    finally:
        eng.shutdown()


def test_the_engine_loops_steps_are_profiled_by_kind_and_graph(engine) -> None:
    """Every step megatron's loop awaits is in ``step_profile()``: forced to exactly three steps of three requests,
    the window holds three decode-graph steps on the 4 graph, each decoding three requests."""
    eng, _ = engine
    assert eng.step_profile() is None  # before bring_up
    eng.bring_up()
    llm = fake(eng)
    llm.engine.allow_steps = 0
    before = eng.step_profile()
    assert before is not None, "bring_up did not profile megatron's loop"
    handles = [eng.submit([5, 6, 7], max_tokens=8) for _ in range(3)]
    wait_until(lambda: len(llm.engine.requests) == 3, "three requests in the engine")
    llm.engine.allow_steps = 3
    wait_until(lambda: llm.engine.steps == 3, "three decode steps")
    # one round trip through the loop: the step that made ``steps`` 3 has returned through the wrapper by then
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), eng._loop).result(timeout=20)
    w = window(before, eng.step_profile())
    assert w["steps"] == 3 and "decode_graph" in w, w
    assert w["decode_graph"]["steps"] == 3 and w["decode_graph"]["mean_ran"] == 3
    assert w["decode_graph"]["graphs"]["4"]["steps"] == 3
    llm.engine.allow_steps = None
    wait_until(lambda: all(h.done() for h in handles), "every answer")
    assert [len(h.result().token_ids) for h in handles] == [8, 8, 8]


def test_a_loop_that_stops_stepping_through_the_wrapper_is_logged_once(engine, caplog) -> None:
    """A megatron whose loop no longer awaits the engine object's ``async_step`` would leave the profile short
    without a word: ``step_profile()`` compares megatron's own step count with what the profile saw and says so
    once. Not for steps through the wrapper, nor for an idle expert-parallel rank's dummy forwards (megatron counts
    them as steps), nor after megatron sets its count back to 0; past the margin of a step under way, yes."""
    import logging

    eng, _ = engine
    said = lambda: [r for r in caplog.records if "did not reach the step profile" in r.getMessage()]  # noqa: E731
    with caplog.at_level(logging.WARNING):
        eng.bring_up()
        llm = fake(eng)
        llm.engine.idle_dummy_forwards = 10  # an idle EP rank joining its peers' steps
        wait_until(lambda: llm.engine.steps == 10, "ten dummy forwards")
        llm.engine.allow_steps = 2
        first = eng.submit([5, 6, 7], max_tokens=8)
        wait_until(lambda: llm.engine.steps == 12, "two steps through the wrapper")
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), eng._loop).result(timeout=20)
        profile = eng.step_profile()
        assert profile["steps"] == 2 and profile["dummy_forwards"] == 10 and not said()
        llm.engine.count_base = llm.engine.steps  # megatron captured its graphs again: its count back to 0
        llm.engine.allow_steps = 1
        wait_until(lambda: llm.engine.steps == 13, "a step after the reset")
        assert eng.step_profile() is not None and not said()
        llm.engine.step_through_class = True
        llm.engine.allow_steps = 2
        wait_until(lambda: llm.engine.steps == 15, "two steps past the wrapper")
        eng.step_profile()
        assert not said()  # two: as many as megatron may count before the profile sees them
        llm.engine.allow_steps = 1
        wait_until(lambda: llm.engine.steps == 16, "a third step past the wrapper")
        eng.step_profile()
        eng.step_profile()
    assert len(said()) == 1 and "counted 3 steps" in said()[0].getMessage(), [r.getMessage() for r in said()]
    llm.engine.allow_steps = None
    wait_until(first.done, "the answer")


def test_the_consensus_interval_is_1_at_expert_parallelism_1_and_megatrons_otherwise() -> None:
    """megatron's loop checks for a pause only every ``ep_consensus_interval`` iterations while it has work; the
    check is local at expert parallelism 1, so colo-fsm asks for every step there and leaves megatron's 20 where
    each check is an all-reduce; a value set is passed as it is, and a bad one refused by name."""
    from colo_fsm.adapters.megatron.coordinator_config import expert_parallel_size

    assert CoordinatorConfig().consensus_interval(1) == 1 and CoordinatorConfig().consensus_interval(2) is None
    assert CoordinatorConfig(ep_consensus_interval=5).consensus_interval(1) == 5
    assert CoordinatorConfig(ep_consensus_interval=5).consensus_interval(4) == 5
    for bad in (0, -1, True, 2.5, "1"):
        with pytest.raises(ConfigError, match="ep_consensus_interval"):
            CoordinatorConfig(ep_consensus_interval=bad)
    from megatron.core import parallel_state

    with pytest.MonkeyPatch.context() as mp:  # megatron's model parallelism not initialized: the configs say
        mp.setattr(parallel_state, "model_parallel_is_initialized", lambda: False)
        assert expert_parallel_size(CoordinatorConfig(), types.SimpleNamespace(expert_model_parallel_size=4)) == 4
        assert expert_parallel_size(CoordinatorConfig(expert_model_parallel_size=2), None) == 2
        assert expert_parallel_size(CoordinatorConfig(), {"ep": 8}) == 8
        assert expert_parallel_size(CoordinatorConfig(), {"expert_model_parallel_size": None, "ep": 4}) == 4
        assert expert_parallel_size(CoordinatorConfig(), types.SimpleNamespace(tensor_model_parallel_size=2)) == 1
        with pytest.raises(ConfigError, match="training_config.expert_model_parallel_size"):
            expert_parallel_size(CoordinatorConfig(), {"ep": "4"})
        mp.setattr(parallel_state, "model_parallel_is_initialized", lambda: True)  # the group megatron's engine reads
        mp.setattr(parallel_state, "get_expert_model_parallel_world_size", lambda: 2)
        assert expert_parallel_size(CoordinatorConfig(), types.SimpleNamespace(expert_model_parallel_size=1)) == 2


def test_megatrons_loop_takes_its_pause_consensus_every_interval_and_locally_at_expert_parallelism_1() -> None:
    """What the setting rests on, read in the installed megatron-core: the loop takes the consensus again (and so
    sees a pause) only when the last one saw no work or at every ``ep_consensus_interval``-th iteration, and the
    consensus is an all-reduce only above expert parallelism 1."""
    import inspect

    engines = pytest.importorskip("megatron.core.inference.engines.dynamic_engine", reason="megatron-core")
    cls = engines.DynamicInferenceEngine
    loop = " ".join(inspect.getsource(cls.run_engine_with_coordinator).split())
    assert (
        "global_work_from_last_consensus == 0 or self._ep_consensus_loop_counter % self.ep_consensus_interval == 0"
        in loop
    )
    assert "self._last_ep_consensus = (0, False)" in loop  # dropped at UNPAUSING, as the test fake does
    assert "self.ep_consensus_interval = inference_config.ep_consensus_interval" in inspect.getsource(cls.__init__)
    consensus = inspect.getsource(cls._ep_establish_consensus)
    assert (
        "if self.ep_world_size > 1:" in consensus
        and "global_work, global_consensus = local_work, consensus_val" in consensus
    )


@pytest.mark.parametrize("interval", [None, 20])
def test_a_pause_lands_at_the_next_step_unless_megatrons_interval_is_kept(interval) -> None:
    """Forced: the pause reaches megatron's loop just after a consensus (its counter at 1). With the interval
    colo-fsm sets at expert parallelism 1 the pause lands at once; with megatron's default 20 the loop decodes 19
    more steps first. ``pause_steps`` records, per suspend, megatron's steps from asking the pause to SUSPENDED.
    The engine holds at 2 steps until ``pause()`` runs on its loop, so a calling thread late between reading the
    step count and sending the pause (a busy machine) adds no step to the count."""
    config = CoordinatorConfig(watch_interval_s=0.01, control_timeout_s=30.0, ep_consensus_interval=interval)
    eng = CoordinatorEngine(TinyModel(), CharTokenizer(), config, llm_factory=FakeAsyncLLM)
    try:
        eng.bring_up()
        llm = fake(eng)
        assert llm.engine.consensus_interval == eng.consensus_interval == (interval or 1)
        llm.engine.allow_steps = 2
        h = eng.submit([5, 6, 7], max_tokens=50)
        wait_until(lambda: llm.engine.steps == 2, "two decode steps")
        llm.engine.counter_at_pause = 1
        llm.engine.free_at_pause = True
        eng.suspend()
        (landed,) = eng.pause_steps
        assert landed == (0 if interval is None else 19), landed
        assert not h.done()  # parked across it
        eng.resume()
        assert h.result(timeout=20).token_ids and len(h.result().token_ids) == 50
    finally:
        eng.shutdown()


def test_a_count_megatron_sets_to_0_at_a_resume_loses_no_step_of_the_loop_check(engine, caplog) -> None:
    """megatron's count goes back to 0 at a resume that captures its graphs again; the engine tells the check the
    count at SUSPENDED and after RESUMED, so steps that bypass the wrapper after it are told at their number (3),
    not hidden behind the steps before the resume."""
    import logging

    eng, _ = engine
    said = lambda: [r for r in caplog.records if "did not reach the step profile" in r.getMessage()]  # noqa: E731
    eng.bring_up()
    llm = fake(eng)
    llm.engine.reset_count_at_resume = True
    llm.engine.allow_steps = 5
    h = eng.submit([5, 6, 7], max_tokens=30)
    wait_until(lambda: llm.engine.steps == 5, "five steps through the wrapper")
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), eng._loop).result(timeout=20)
    eng.suspend()
    eng.resume()
    assert llm.engine.context.step_count == 0  # megatron's count set back
    llm.engine.allow_steps = 8  # past the count held at the suspend before the next read
    wait_until(lambda: llm.engine.steps == 13, "eight steps through the wrapper")
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), eng._loop).result(timeout=20)
    llm.engine.step_through_class = True
    llm.engine.allow_steps = 3
    wait_until(lambda: llm.engine.steps == 16, "three steps past the wrapper")
    with caplog.at_level(logging.WARNING):
        assert eng.step_profile()["steps"] == 13
    assert len(said()) == 1 and "counted 3 steps" in said()[0].getMessage(), [r.getMessage() for r in said()]
    llm.engine.step_through_class = False
    llm.engine.allow_steps = None
    wait_until(h.done, "the answer")


def _bench_on_the_scripted_loop(monkeypatch, tmp_path, *extra: str, counter_at_pause: int | None = None) -> dict:
    """``bench/inflight_handoff.py --engine coordinator`` on the CPU: the bench's own model, tokenizer, lifecycle
    and collector, with megatron's loop scripted (:class:`FakeAsyncLLM`); its JSON."""
    import json

    import bench._handoff as handoff
    from bench import inflight_handoff

    class ScriptedLoop(CoordinatorEngine):
        def bring_up(self) -> None:
            super().bring_up()
            self._llm.engine.counter_at_pause = counter_at_pause
            self._llm.engine.free_at_pause = True

        def suspend(self) -> None:
            # a parking engine holds from here until pause() runs on its loop: a late calling thread adds no step
            # to pause_steps (each handoff counts only what megatron's loop does after the pause is sent); a
            # draining one must step to drain
            assert self.inflight is InflightPolicy.PARK, "the scripted loop's runs park (sync parks nothing)"
            self._llm.engine.allow_steps = 0
            try:
                super().suspend()
            finally:
                self._llm.engine.allow_steps = None

    def scripted(mode, args, shape, model, tokenizer, weight_version, max_sequence_length):
        config = CoordinatorConfig(max_requests=shape.max_active_requests, watch_interval_s=0.01,
                                   ep_consensus_interval=args.ep_consensus_interval)  # fmt: skip
        return ScriptedLoop(model, tokenizer, config, weight_version=weight_version,
                            max_sequence_length=max_sequence_length, llm_factory=FakeAsyncLLM)  # fmt: skip

    monkeypatch.setitem(handoff.ENGINES, "coordinator", scripted)
    out = tmp_path / "run.json"
    argv = ["--workload", "reasoning", "--smoke", "--model", "small", "--max-len", "48", "--engine", "coordinator",
            "--modes", "park,sync", "--out", str(out), *extra]  # fmt: skip
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    try:
        assert inflight_handoff.main(argv) == 0
    finally:
        logger.setLevel(level)  # the bench quiets colo-fsm's logs for its run; the tests after it read them
    return json.loads(out.read_text())


def test_the_handoff_bench_on_the_coordinator_loop_records_where_each_pause_landed(monkeypatch, tmp_path) -> None:
    """The coordinator path's bench run, on the CPU: the loop's consensus interval in the JSON (1, colo-fsm's at
    expert parallelism 1) and, per measured handoff, megatron's steps from asking the pause to SUSPENDED (at most
    the step under way); a run at megatron's 20, its pause forced to arrive just after a consensus, records the 19
    steps park's pauses waited, and is a workload of its own, never pooled with the other."""
    from bench.gpu_runs import workload_model

    ours = _bench_on_the_scripted_loop(monkeypatch, tmp_path)
    assert ours["ep_consensus_interval"] == 1
    for mode in ("park", "sync"):
        row = ours["modes"][mode]
        assert row["measured_steps"] >= 3 and len(row["pause_steps"]) == row["measured_steps"], row.get("pause_steps")
        assert row["pause_steps_max"] <= 1, row["pause_steps"]
    kept = _bench_on_the_scripted_loop(monkeypatch, tmp_path, "--ep-consensus-interval", "20", counter_at_pause=1)
    assert kept["ep_consensus_interval"] == 20
    assert kept["modes"]["park"]["pause_steps_max"] >= 19, kept["modes"]["park"]["pause_steps"]
    assert workload_model(ours) == "small on the coordinator loop, pause checked every step"
    assert (
        workload_model(kept)
        == workload_model({**ours, "ep_consensus_interval": None})
        == (
            "small on the coordinator loop"  # megatron's 20, as every run before the setting
        )
    )


def test_an_engine_whose_expert_parallelism_differs_from_what_colo_fsm_read_is_said(caplog) -> None:
    """The consensus interval is chosen before megatron builds its engine; where the engine then runs at another
    expert parallelism the start-up says so, naming both and the interval kept (peers must take the consensus in
    the same iterations, so it is not changed on a running loop)."""

    class AtEp2(FakeAsyncLLM):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.engine.ep_world_size = 2

    eng = CoordinatorEngine(TinyModel(), CharTokenizer(), CoordinatorConfig(watch_interval_s=0.01), llm_factory=AtEp2)
    try:
        with caplog.at_level(logging.WARNING):
            eng.bring_up()
        said = [
            r.getMessage() for r in caplog.records if "expert parallelism 2 where colo-fsm read 1" in r.getMessage()
        ]
        assert len(said) == 1 and "every 1 step(s)" in said[0], said
    finally:
        eng.shutdown()


def test_engine_paths_gives_the_consensus_interval_to_the_coordinator_run_only() -> None:
    """``bench/engine_paths.py`` runs the handoff bench once per engine path with the same arguments, except the
    options only megatron's coordinator loop takes: the direct run (which refuses them) never sees them."""
    from bench.engine_paths import argv_for

    rest = ["--workload", "reasoning", "--ep-consensus-interval", "20", "--steps", "3", "--ep-consensus-interval=4"]
    assert argv_for("coordinator", rest) == rest
    assert argv_for("direct", rest) == ["--workload", "reasoning", "--steps", "3"]


# ---------------------------------------------------------------------------------------------- the abort book
def test_the_abort_book_counts_replies_holds_ended_requests_and_resubmits_a_late_one_at_once() -> None:
    """EndedRequests, the abort-mode handoff's book: the suspend waits for as many replies as megatron ended; an
    ended attempt waits for the resume; one whose reply comes after the resume (a request in megatron's queue took
    one of the replies the suspend waited for) is to be resubmitted at once, never held for a next resume."""
    from colo_fsm.adapters.megatron.coordinator_inflight import EndedRequests

    class Held:
        def __init__(self, prompt: int, done: bool = False) -> None:
            self.attempt_prompt = tuple(range(prompt))
            self.future = concurrent.futures.Future()
            if done:
                self.future.set_result(None)

    book = EndedRequests()
    book.start([1, 2, 3])  # three in flight; megatron ended two (the third waited in its queue)
    assert book.holding and not book.all_replied(2)
    book.replied(3)
    book.replied(9)  # not one the suspend ended: not counted
    assert book.replies == 1 and not book.all_replied(2)
    book.replied(1)
    assert book.all_replied(2)
    a, cancelled = Held(7), Held(5, done=True)
    assert book.hold(a, 7) is False and book.hold(cancelled, 5) is False  # the handoff is under way: held
    assert book.release() == [a, cancelled] and not book.holding
    assert book.stats() == (2, 12, 1, 7)  # the cancelled one is not prefilled again
    late = Held(4)
    assert book.hold(late, 4) is True, "an ended reply after the resume must be resubmitted at once"
    assert book.release() == [late] and book.stats() == (3, 16, 2, 11)
    assert book.release() == []
