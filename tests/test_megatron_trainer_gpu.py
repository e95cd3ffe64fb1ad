"""The megatron backend of the trainer on a GPU (``pytest -m gpu``): megatron-core's DDP, optimizer and
forward-backward schedule under the colocated engine, with the DDP param-gather hooks switched by the mode
control at every suspend and resume (the CPU suite cannot: megatron-core's DDP needs CUDA)."""

from __future__ import annotations

import random

import pytest
import torch
from _megatron_util import tiny
from megatron.core.inference.utils import InferenceMode

from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

TOK = CharTokenizer("0123456789>")
pytestmark = pytest.mark.gpu


def _setup() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from colo_fsm.adapters.megatron.dynamic import dynamic_engine_available

    ok, why = dynamic_engine_available()
    if not ok:
        pytest.skip(f"megatron-core's dynamic engine cannot run here: {why}")
    from colo_fsm.adapters.megatron.parallel import init_distributed

    init_distributed(1, device="cuda")


def _rollouts(eng, n_groups=4, n=4, seed=0):
    from colo_fsm.adapters.megatron.trainer import Rollout

    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = TOK.tokenize("".join(rng.choice("0123456789") for _ in range(3)) + ">")
        for j, c in enumerate(eng.generate_ids([prompt] * n, max_tokens=4 + 12 * g, temperature=1.0, seed=seed + g)):
            out.append(Rollout(c.prompt_ids, c.token_ids, float((g + j) % 2), g, c.logprobs, c.weight_version))
    return out


@pytest.mark.parametrize("hooks", [True, False], ids=["distopt-param-gather-hooks", "plain-ddp"])
def test_megatron_train_step_after_resume_switches_the_ddp_hooks(hooks):
    """suspend turns DDP's param-gather pre-hooks on, the train step runs through megatron-core's schedule and
    optimizer in several micro-batches, resume turns the hooks off with the updated weights in place, twice."""
    _setup()
    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    model = tiny(TOK, device="cuda", max_sequence_length=96, hidden_size=128, num_attention_heads=2)
    cfg = TrainerConfig(lr=1e-2, micro_batch_tokens=64, use_distributed_optimizer=hooks, overlap_param_gather=hooks)
    trainer = MegatronTrainer(model, cfg, pad_id=TOK.pad)  # before the engine: DDP may move params into its buffer
    assert trainer.backend == "megatron" and trainer.ddp is not None
    eng = MegatronEngine(model, TOK, GenerationConfig(buffer_size_gb=0.5))
    assert eng.mode is trainer.mode  # one control of the shared model, DDP hooks included
    expect_on = True if hooks else None
    expect_off = False if hooks else None
    eng.bring_up()
    assert trainer.mode.read().param_gather_hooks == expect_off
    name, param = next((n, p) for n, p in model.named_parameters() if "linear_fc1.weight" in n)
    for cycle in range(2):
        rs = _rollouts(eng, seed=cycle)
        eng.suspend()
        assert not InferenceMode.is_active()
        assert trainer.mode.read().param_gather_hooks == expect_on
        before = param.detach().clone()
        res = trainer.train_step(rs)
        assert res.consumed_samples == len(rs)
        assert res.metrics["train/micro_batches"] > 1
        assert torch.isfinite(torch.tensor(res.metrics["train/loss"]))
        assert res.metrics["train/grad_norm"] > 0
        trainer.offload_buffers()
        eng.resume()
        trainer.restore_buffers()
        assert trainer.mode.read().param_gather_hooks == expect_off
        assert not torch.equal(param.detach(), before), f"{name} unchanged after the step (cycle {cycle})"
        assert eng.generate_ids([TOK.tokenize("12>")], max_tokens=3)  # decode reads the updated weights
    eng.shutdown()


def test_megatron_loss_equals_the_one_pass_torch_loss_on_gpu():
    """The first step's loss through megatron-core's schedule (micro-batched) equals a one-pass torch step's
    on an identical model (bf16 tolerance)."""
    _setup()
    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    kw = {"device": "cuda", "max_sequence_length": 96, "hidden_size": 128, "num_attention_heads": 2}
    m1, m2 = tiny(TOK, **kw), tiny(TOK, **kw)
    eng = MegatronEngine(m2, TOK, GenerationConfig(buffer_size_gb=0.25))
    eng.bring_up()
    rs = _rollouts(eng)
    eng.shutdown()
    meg = MegatronTrainer(m1, TrainerConfig(micro_batch_tokens=64), pad_id=TOK.pad).train_step(rs)
    one = MegatronTrainer(m2, TrainerConfig(backend="torch", micro_batch_tokens=10**6), pad_id=TOK.pad).train_step(rs)
    assert meg.metrics["train/micro_batches"] > 1 and one.metrics["train/micro_batches"] == 1
    assert meg.metrics["train/loss"] == pytest.approx(one.metrics["train/loss"], rel=3e-2, abs=3e-3)
    assert meg.metrics["train/grad_norm"] == pytest.approx(one.metrics["train/grad_norm"], rel=5e-2)


@pytest.mark.parametrize("distributed", [False, True], ids=["optimizer", "distributed-optimizer"])
def test_megatron_optimizer_checkpoint_roundtrip_on_gpu(tmp_path, distributed):
    """megatron-core's optimizer saves and loads through dist_checkpointing (its own sharded state dict)."""
    _setup()
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig

    model = tiny(TOK, device="cuda", max_sequence_length=64, hidden_size=128, num_attention_heads=2)
    cfg = TrainerConfig(checkpoint_dir=str(tmp_path), use_distributed_optimizer=distributed)
    tr = MegatronTrainer(model, cfg)
    rs = [Rollout((1, 2, 3), (4, 5, 6, 7), float(i % 2), i // 2) for i in range(8)]
    tr.train_step(rs)
    tr.save_checkpoint(1, 1, {"k": 1})
    saved = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    tr.train_step(rs)
    after_one = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    tr.train_step(rs)
    info = tr.load_checkpoint()
    assert (info.step, info.weight_version, info.extra_state) == (1, 1, {"k": 1})
    for k, v in model.state_dict().items():
        if k in saved:
            torch.testing.assert_close(v, saved[k], msg=k)
    # the optimizer state came back too: the same step from the loaded state lands on the same weights
    tr.train_step(rs)
    for k, v in model.state_dict().items():
        if k in after_one:
            torch.testing.assert_close(v, after_one[k], msg=f"{k} after a step from the loaded optimizer state")


def test_the_memory_budget_prices_megatrons_grad_buffer_and_optimizer_as_they_hold_memory():
    """After a train step on the megatron backend, the budget's gradient term equals the bytes of DDP's grad
    buffer views (``main_grad``) and its optimizer term the moments plus the fp32 main copies the optimizer
    really holds (megatron's Adam: 12 bytes a bf16 parameter where torch AdamW holds 4)."""
    _setup()
    from colo_fsm.adapters.megatron.memory import training_shape
    from colo_fsm.adapters.megatron.train_backend import torch_optimizers
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig
    from colo_fsm.guards.memory import GIB, MemoryBudget, estimate

    model = tiny(TOK, device="cuda", max_sequence_length=64, hidden_size=128, num_attention_heads=2)
    tr = MegatronTrainer(model, TrainerConfig(), pad_id=TOK.pad)
    assert tr.backend == "megatron" and tr.optimizer_shards == 1
    tr.train_step([Rollout((1, 2, 3), (4, 5, 6, 7), float(i % 2), i // 2) for i in range(8)])
    params = [p for p in model.parameters() if p.requires_grad]
    mine = {id(p) for p in params}
    grad_bytes = sum(p.main_grad.numel() * p.main_grad.element_size() for p in params)
    held = 0
    for opt in torch_optimizers(tr.optimizer):
        held += sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if t.dim() > 0)
        held += sum(q.numel() * q.element_size() for g in opt.param_groups for q in g["params"] if id(q) not in mine)
    est = estimate(
        training_shape(model), MemoryBudget(), buffer_size_gb=0.0, kv_cache_mode="persist", capacity_gib=80.0
    )
    assert params[0].dtype == torch.bfloat16 and held > 0
    assert est.grads_gib * GIB == pytest.approx(grad_bytes, rel=1e-9), (est.grads_gib * GIB, grad_bytes)
    assert est.optimizer_gib * GIB == pytest.approx(held, rel=1e-9), (est.optimizer_gib * GIB, held)
