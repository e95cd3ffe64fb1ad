"""Token-budget micro-batches: the plan's bounds, and a micro-batched step equal to the one-pass step (CPU, the
torch backend: megatron-core's DDP needs CUDA; tests/test_megatron_trainer_gpu.py covers the megatron one)."""

from __future__ import annotations

import random

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron.microbatch import plan_microbatches
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig
from colo_fsm.errors import ConfigError

TOK = CharTokenizer("0123456789>")


def test_plan_covers_every_row_once_within_the_budget():
    rng = random.Random(0)
    lengths = [max(1, min(200, round(rng.lognormvariate(3.5, 1.0)))) for _ in range(300)]
    plan = plan_microbatches(lengths, 512)
    rows = sorted(i for b in plan.batches for i in b)
    assert rows == list(range(len(lengths)))
    for b in plan.batches:
        longest = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * longest <= 512
    # length buckets: far less padding than one pass padded to the longest rollout
    assert plan.padded_tokens < 0.5 * len(lengths) * max(lengths)
    assert plan.real_tokens == sum(lengths) <= plan.padded_tokens
    assert plan == plan_microbatches(lengths, 512)  # deterministic: every DP rank plans the same


def test_a_rollout_longer_than_the_budget_gets_a_micro_batch_of_its_own():
    plan = plan_microbatches([10, 900, 10, 10], 100)
    assert plan.batches[0] == (1,)
    assert sorted(i for b in plan.batches[1:] for i in b) == [0, 2, 3]


@pytest.mark.parametrize(
    "lengths,budget,field", [([], 10, "batch"), ([3], 0, "micro_batch_tokens"), ([3, 0], 10, "rollout length")]
)
def test_plan_refuses_bad_input(lengths, budget, field):
    with pytest.raises(ConfigError, match=field):
        plan_microbatches(lengths, budget)


def _batch(with_logprobs: bool) -> list[Rollout]:
    rng = random.Random(1)
    out = []
    for g in range(3):
        for j in range(4):
            prompt = tuple(rng.randrange(1, 10) for _ in range(rng.randrange(2, 5)))
            comp = tuple(rng.randrange(1, 11) for _ in range(rng.choice([1, 2, 5, 9, 20])))
            lps = tuple(-rng.uniform(0.5, 3.0) for _ in comp) if with_logprobs else ()
            out.append(Rollout(prompt, comp, float((g + j) % 3), g, lps))
    return out


@pytest.mark.parametrize("with_logprobs", [False, True])
def test_micro_batched_step_equals_the_one_pass_step(dist1, with_logprobs):  # noqa: F811
    """Same loss and same gradients (before the optimizer) whether the batch runs in one pass or in many."""
    batch = _batch(with_logprobs)
    grads = {}
    metrics = {}
    for budget in (10_000, 30):
        model = tiny(TOK)  # same seed: identical weights
        tr = MegatronTrainer(model, TrainerConfig(micro_batch_tokens=budget, grad_clip=1e9, lr=1e-9))
        assert tr.backend == "torch"
        res = tr.train_step(batch)
        metrics[budget] = res.metrics
        grads[budget] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert metrics[10_000]["train/micro_batches"] == 1
    assert metrics[30]["train/micro_batches"] >= 4
    assert metrics[30]["train/padded_tokens"] < metrics[10_000]["train/padded_tokens"]
    assert metrics[30]["train/loss"] == pytest.approx(metrics[10_000]["train/loss"], rel=1e-5, abs=1e-6)
    assert metrics[30]["train/grad_norm"] == pytest.approx(metrics[10_000]["train/grad_norm"], rel=1e-4)
    assert metrics[30]["train/clip_frac"] == pytest.approx(metrics[10_000]["train/clip_frac"], abs=1e-9)
    assert grads[30].keys() == grads[10_000].keys() and grads[30]
    for name, g in grads[10_000].items():
        torch.testing.assert_close(grads[30][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_megatron_only_options_are_refused_on_the_cpu(dist1):  # noqa: F811
    model = tiny(TOK)
    with pytest.raises(ConfigError, match="backend"):
        MegatronTrainer(model, TrainerConfig(backend="megatron"))
    with pytest.raises(ConfigError, match="use_distributed_optimizer"):
        MegatronTrainer(model, TrainerConfig(use_distributed_optimizer=True))
    with pytest.raises(ConfigError, match="overlap_param_gather"):
        TrainerConfig(overlap_param_gather=True)
    with pytest.raises(ConfigError, match="overlap_grad_reduce"):
        TrainerConfig(backend="torch", overlap_grad_reduce=True)
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        TrainerConfig(micro_batch_tokens=0)
    with pytest.raises(ConfigError, match="backend"):
        TrainerConfig(backend="apex")


class _DDPStandIn(torch.nn.Module):
    """What the schedule needs of megatron-core's DDP on the CPU: forward, set_input_tensor, a grad-buffer reset."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def set_input_tensor(self, t) -> None:
        self.module.set_input_tensor(t)

    def zero_grad_buffer(self) -> None:
        pass


class _OptimizerStandIn:
    """megatron-core's optimizer interface over the trainer's torch AdamW: ``step() -> (ok, grad_norm, zeros)``."""

    def __init__(self, trainer: MegatronTrainer) -> None:
        self.trainer, self.inner = trainer, trainer.optimizer

    def zero_grad(self) -> None:
        self.inner.zero_grad(set_to_none=True)

    def step(self):
        return True, self.trainer._clip_grad_norm(), None


@pytest.mark.parametrize("with_logprobs", [False, True])
def test_megatron_schedule_path_equals_the_one_pass_step(dist1, monkeypatch, with_logprobs):  # noqa: F811
    """The megatron backend's use of ``get_forward_backward_func()`` (its per-micro-batch loss handed over times
    the micro-batch count, which the schedule averages) gives the one-pass loss and gradients. On the CPU:
    megatron-core's DDP needs CUDA, so a stand-in takes its place, and the schedule's one CUDA allocation (its
    token counter) is redirected to the CPU for this test only."""
    real_zeros = torch.zeros

    def zeros(*a, **k):
        if k.get("device") == "cuda":
            k["device"] = "cpu"
        return real_zeros(*a, **k)

    monkeypatch.setattr(torch, "zeros", zeros)
    batch = _batch(with_logprobs)
    got = {}
    for kind in ("one-pass", "schedule"):
        model = tiny(TOK)
        budget = 30 if kind == "schedule" else 10**6
        tr = MegatronTrainer(model, TrainerConfig(micro_batch_tokens=budget, grad_clip=1e9, lr=1e-9))
        if kind == "schedule":
            tr.backend, tr.ddp, tr.optimizer = "megatron", _DDPStandIn(model), _OptimizerStandIn(tr)
            monkeypatch.setattr(model.config, "finalize_model_grads_func", None, raising=False)
        res = tr.train_step(batch)
        got[kind] = (res.metrics, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (m1, g1), (m2, g2) = got["one-pass"], got["schedule"]
    assert m2["train/micro_batches"] >= 4 and m1["train/micro_batches"] == 1
    assert m2["train/loss"] == pytest.approx(m1["train/loss"], rel=1e-5, abs=1e-6)
    assert g2.keys() == g1.keys() and g1
    for name, g in g1.items():
        torch.testing.assert_close(g2[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_the_distributed_optimizer_is_asked_for_a_layout_dist_checkpointing_saves(tmp_path, dist1):  # noqa: F811
    """megatron-core 0.19.2's distributed optimizer defaults to flattened-range state, which its dist-checkpointing
    refuses: its sharded state is asked for ``dp_reshardable`` (on save and on load), the plain optimizers for
    nothing; the old refusal and its opt-in are gone."""
    from megatron.core.optimizer import ChainedOptimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from colo_fsm.adapters.megatron import checkpoint
    from colo_fsm.adapters.megatron.trainer import TrainerConfig

    TrainerConfig(use_distributed_optimizer=True, checkpoint_dir=str(tmp_path))  # no longer refused
    with pytest.raises(TypeError, match="unverified_distributed_optimizer_checkpoint"):
        TrainerConfig(unverified_distributed_optimizer_checkpoint=True)  # type: ignore[call-arg]

    asked = []

    class Sharded(DistributedOptimizer):  # a stand-in: megatron's class needs a GPU to build
        def sharded_state_dict(self, model_sd, is_loading=False, metadata=None):
            asked.append((is_loading, metadata))
            return {}

    dist = object.__new__(Sharded)
    chained = object.__new__(ChainedOptimizer)
    chained.chained_optimizers = [dist]
    want = {"distrib_optim_sharding_type": "dp_reshardable"}
    assert checkpoint.optimizer_metadata(dist) == want and checkpoint.optimizer_metadata(chained) == want
    assert checkpoint.optimizer_metadata(object()) is None
    model = tiny(TOK)
    for loading in (False, True):
        checkpoint._sharded_state(model, dist, {}, {"step": 1}, is_loading=loading)
    assert asked == [(False, want), (True, want)]
