"""Trainer on the shared model: training after generation is training, no-copy weight sync, offload,
atomic checkpoints with extra state, and the lifecycle driving the real adapters."""

from __future__ import annotations

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401
from megatron.core.inference.utils import InferenceMode

from colo_fsm.adapters.megatron.checkpoint import latest_checkpoint, load_checkpoint
from colo_fsm.adapters.megatron.engine import MegatronEngine
from colo_fsm.adapters.megatron.refit import RefitEngine
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig, group_advantages
from colo_fsm.adapters.protocols import Trainer
from colo_fsm.errors import ConfigError, LifecycleError, UnsupportedEngine

TOK = CharTokenizer("0123456789>")


def _rollouts(engine, prompts=("123>", "905>"), n=4, seed=0):
    out = []
    for g, p in enumerate(prompts):
        ans = [*TOK.tokenize(p[:-1][::-1]), TOK.eod]
        for c in engine.generate_ids([TOK.tokenize(p)] * n, max_tokens=4, temperature=1.0, seed=seed + g):
            r = sum(a == b for a, b in zip(c.token_ids, ans)) / len(ans)
            out.append(Rollout(c.prompt_ids, c.token_ids, r, g, c.logprobs, c.weight_version))
    return out


def _varied(rollouts):
    """Make sure every group has reward spread (so GRPO advantages are non-zero)."""
    return [
        Rollout(r.prompt_ids, r.completion_ids, float(i % 2), r.group, r.logprobs, r.weight_version)
        for i, r in enumerate(rollouts)
    ]


def test_group_advantages_are_normalized_per_group():
    rs = [Rollout((1,), (2,), x, g) for g, x in [(0, 1.0), (0, 0.0), (1, 0.5), (1, 0.5)]]
    adv = group_advantages(rs)
    assert adv[0] == pytest.approx(1.0, abs=1e-4) and adv[1] == pytest.approx(-1.0, abs=1e-4)
    assert adv[2] == adv[3] == 0.0  # no spread, no signal


def test_training_forward_after_generation_behaves_as_training(dist1):  # noqa: F811
    model = tiny(TOK, hidden_dropout=0.3)
    eng = MegatronEngine(model, TOK)
    trainer = MegatronTrainer(model, TrainerConfig())
    assert isinstance(trainer, Trainer)
    eng.bring_up()
    rs = _varied(_rollouts(eng))
    assert InferenceMode.is_active() and not model.training
    eng.suspend()
    assert not InferenceMode.is_active()
    InferenceMode.set_active()  # even if something left the flag set, the trainer clears it before its forward
    trainer.enter_training_mode()
    assert not InferenceMode.is_active() and model.training
    torch.manual_seed(0)
    lp1, _ = trainer.token_logprobs(rs)
    lp2, _ = trainer.token_logprobs(rs)
    assert lp1.requires_grad  # an autograd graph is built
    assert not torch.allclose(lp1, lp2)  # dropout is active: a training forward, not an inference one
    result = trainer.train_step(rs)
    assert result.consumed_samples == len(rs) and result.metrics["train/grad_norm"] > 0
    assert not model.training  # back in eval mode for generation
    eng.resume()
    assert InferenceMode.is_active()
    eng.shutdown()


def test_weight_sync_is_no_copy_output_changes_after_train_steps(dist1):  # noqa: F811
    model = tiny(TOK)
    eng = MegatronEngine(model, TOK)
    trainer = MegatronTrainer(model, TrainerConfig(lr=5e-2))
    eng.bring_up()
    prompts = ["123>", "905>", "44>", "7>"]
    before = [c.token_ids for c in eng.generate(prompts, max_tokens=4)]
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    rs = _varied(_rollouts(eng))
    for _ in range(3):
        eng.suspend()
        trainer.train_step(rs)
        trainer.offload_buffers()
        eng.resume()
        trainer.restore_buffers()
    after = [c.token_ids for c in eng.generate(prompts, max_tokens=4)]
    assert before != after
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == ptrs  # same storage: nothing was copied
    assert eng.model is trainer.model is model
    eng.shutdown()


def test_offload_frees_gradients_and_training_while_offloaded_is_refused(dist1):  # noqa: F811
    model = tiny(TOK)
    eng = MegatronEngine(model, TOK)
    trainer = MegatronTrainer(model, TrainerConfig())
    eng.bring_up()
    rs = _varied(_rollouts(eng))
    eng.suspend()
    trainer.train_step(rs)
    assert any(p.grad is not None for p in model.parameters())
    trainer.offload_buffers()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(LifecycleError, match="offloaded"):
        trainer.train_step(rs)
    trainer.restore_buffers()
    trainer.train_step(rs)
    with pytest.raises(ConfigError, match="batch"):
        trainer.train_step([])
    eng.shutdown()


def test_checkpoint_roundtrip_is_atomic_and_restores_extra_state(dist1, tmp_path):  # noqa: F811
    model = tiny(TOK)
    eng = MegatronEngine(model, TOK)
    trainer = MegatronTrainer(model, TrainerConfig(checkpoint_dir=str(tmp_path)))
    eng.bring_up()
    rs = _varied(_rollouts(eng))
    eng.suspend()
    trainer.train_step(rs)
    extra = {"colo_fsm": {"step": 1, "weight_version": 1}, "replay_buffer": {"groups": [{"prompt": "12>"}]}}
    trainer.save_checkpoint(1, 1, extra)
    saved = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    saved_opt = {k: v.clone() for k, v in trainer.optimizer.state[next(model.parameters())].items()}
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000001"
    # a half-written save of a later step is never what "latest" points at
    (tmp_path / ".incomplete-step_00000002").mkdir()
    trainer.train_step(rs)
    trainer.train_step(rs)
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items() if k in saved)
    info = trainer.load_checkpoint()
    assert (info.step, info.weight_version) == (1, 1)
    assert info.extra_state == extra
    for k, v in model.state_dict().items():
        if k in saved:
            assert torch.equal(saved[k], v), k
    for k, v in trainer.optimizer.state[next(model.parameters())].items():
        assert torch.equal(saved_opt[k], v), k
    # a second save of the same step replaces it whole
    trainer.save_checkpoint(1, 1, {"x": 2})
    assert load_checkpoint(tmp_path, model=model).extra_state == {"x": 2}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["latest", "step_00000001"]
    with pytest.raises(ConfigError, match="checkpoint"):
        load_checkpoint(tmp_path / "nope", model=model)
    eng.shutdown()


def test_lifecycle_drives_the_real_adapters(dist1, tmp_path):  # noqa: F811
    from colo_fsm.guards import CheckpointDecision, ValidationDecision
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
    from colo_fsm.states.spec import State

    model = tiny(TOK)
    lc_ref = {}
    eng = MegatronEngine(model, TOK, weight_version=lambda: lc_ref["lc"].weight_version)
    trainer = MegatronTrainer(model, TrainerConfig(checkpoint_dir=str(tmp_path / "ckpt")))
    seen = []

    def validator(step, wv):
        assert InferenceMode.is_active() and eng.awake
        seen.append((step, wv))
        return {"val/n": float(len(eng.generate(["12>"], max_tokens=3)))}

    lc = Lifecycle(
        eng,
        trainer,
        config=LifecycleConfig(num_steps=4, trace_path=tmp_path / "trace.jsonl"),
        checkpoint=CheckpointDecision(2),
        validation=ValidationDecision(2),
        validator=validator,
        checkpoint_extra=lambda: {"buffer": ["g1"]},
    )
    lc_ref["lc"] = lc
    lc.start()
    versions = []
    while not lc.finished:
        rs = _varied(_rollouts(eng, n=2))
        assert all(r.weight_version == lc.weight_version for r in rs)
        lc.step(rs)
        versions.append(lc.weight_version)
    assert versions == [1, 2, 3, 4]
    assert lc.state is State.DONE and not eng.awake and not InferenceMode.is_active()  # last step never wakes
    assert seen == [(2, 2)]  # step index 1 saved then validated; step index 3 is last: saved, no wake
    info = load_checkpoint(tmp_path / "ckpt", model=model)
    assert (info.step, info.weight_version) == (4, 4)
    assert info.extra_state["buffer"] == ["g1"] and info.extra_state["colo_fsm"]["weight_version"] == 4
    lc.stop()
    assert eng.torn_down
    dests = [r.dest for r in lc.trace.records]
    assert dests.count("Checkpointing") == 2 and "Validating" in dests


def test_lifecycle_refuses_an_engine_that_refits_weights(dist1):  # noqa: F811
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig

    model = tiny(TOK)
    refit = RefitEngine(model)
    with pytest.raises(UnsupportedEngine, match="reads_weights_in_place"):
        Lifecycle(refit, MegatronTrainer(model))
    Lifecycle(refit, MegatronTrainer(model), config=LifecycleConfig(async_training=False))  # sync: allowed


def test_global_grad_norm_clipping_matches_torch_on_one_rank(dist1):  # noqa: F811
    model = tiny(TOK)
    trainer = MegatronTrainer(model, TrainerConfig(grad_clip=0.01))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    expected = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    norm = trainer._clip_grad_norm()
    assert norm == pytest.approx(float(expected), rel=1e-5)
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert float(clipped) == pytest.approx(0.01, rel=1e-3)
