"""The memory budget before build: exact arithmetic of the estimate, and a real megatron engine on the CPU
with a stated device capacity refusing an over-budget configuration (with numbers and options) before it
builds anything, accepting a fitting one, and only warning when told to."""

from __future__ import annotations

import logging

import pytest

from colo_fsm.errors import ConfigError, MemoryBudgetExceeded
from colo_fsm.guards.memory import GIB, MemoryBudget, TrainingShape, activation_bytes, check_budget, estimate
from tests._megatron_util import dist1, tiny  # noqa: F401

SHAPE = TrainingShape(
    num_parameters=1024**3,  # 1 Gi parameters of 2 bytes: 2 GiB
    param_bytes=2,
    grad_bytes=2,
    optimizer_bytes_per_param=4,
    num_layers=16,
    hidden_size=1024,
    num_attention_heads=16,
    vocab_size=32768,
)


def test_estimate_adds_training_peak_kv_and_margin():
    budget = MemoryBudget(micro_batch_size=4, sequence_length=2048, margin_fraction=0.1, margin_min_gib=1.0)
    est = estimate(SHAPE, budget, buffer_size_gb=40.0, kv_cache_mode="persist", capacity_gib=80.0)
    b = est.breakdown()
    assert (b["params_gib"], b["grads_gib"], b["optimizer_gib"]) == (2.0, 2.0, 4.0)
    acts = 16 * 2048 * 4 * 1024 * 34
    assert b["activations_gib"] == pytest.approx(acts / GIB)
    assert b["logits_gib"] == pytest.approx(3 * 2048 * 4 * 32768 * 2 / GIB)
    assert b["margin_gib"] == pytest.approx(8.0) and b["kv_during_training_gib"] == 40.0
    assert b["total_gib"] == pytest.approx(b["training_peak_gib"] + 40.0 + 8.0)
    # offload/recompute take the KV buffer off the GPU for training; recompute keeps only layer inputs
    off = estimate(SHAPE, budget, buffer_size_gb=40.0, kv_cache_mode="offload", capacity_gib=80.0)
    assert off.kv_during_training_gib == 0.0 and off.total_gib == pytest.approx(est.total_gib - 40.0)
    rc = activation_bytes(SHAPE, 4, 2048, recompute=True)
    assert rc == pytest.approx(16 * 2 * 2048 * 4 * 1024 + 2048 * 4 * 1024 * 34)
    assert est.recompute_saves_gib == pytest.approx((acts - rc) / GIB)
    assert (
        estimate(
            SHAPE,
            MemoryBudget(optimizer_offloaded=True, sequence_length=8),
            buffer_size_gb=1,
            kv_cache_mode="persist",
            capacity_gib=80,
        ).optimizer_gib
        == 0.0
    )


def test_over_budget_refuses_with_numbers_and_options():
    budget = MemoryBudget(micro_batch_size=4, sequence_length=2048)
    est = estimate(SHAPE, budget, buffer_size_gb=75.0, kv_cache_mode="persist", capacity_gib=80.0)
    with pytest.raises(MemoryBudgetExceeded) as info:
        check_budget(est, budget)
    msg = str(info.value)
    assert f"{est.total_gib:.2f} GiB needed > 80.00 GiB" in msg and "kv_buffer_gib=75.00" in msg
    assert "buffer_size_gb <= " in msg and "kv_cache_mode='offload' or 'recompute'" in msg
    assert (
        "activation recompute" in msg
        and "optimizer state off the device during the training step" in msg
        and "optimizer_shards" in msg
    )
    room = float(msg.split("buffer_size_gb <= ")[1].split()[0])
    smaller = estimate(SHAPE, budget, buffer_size_gb=room, kv_cache_mode="persist", capacity_gib=80.0)
    assert smaller.fits and check_budget(smaller, budget) is smaller  # the suggested buffer does fit
    # the forward the estimate assumed is named with the fields that set it, so a trainer that runs a smaller one
    # can say so (a long-context run refused for 8 sequences of the model's length it never trains on)
    assert "the estimate assumes one micro-batch of 4 x 2,048 tokens (8,192;" in msg
    assert f"activations and logits {est.activations_gib + est.logits_gib:.2f} GiB" in msg
    assert "MemoryBudget(micro_batch_tokens=N)" in msg


def test_a_token_budgeted_trainer_states_its_micro_batch_tokens():
    """A trainer that packs a token budget per micro-batch runs one forward of max(budget, longest sequence)
    tokens: at a 32,768-token model length with a 16,384-token budget that is 32,768 tokens, not the 8 x 32,768 of
    the default question (the reasoning bench was refused at 189.5 GiB for it on an H200)."""
    long = MemoryBudget(sequence_length=32_768)
    packed = MemoryBudget(sequence_length=32_768, micro_batch_tokens=16_384)
    assert long.forward(99) == (8, 32_768) and packed.forward(99) == (1, 32_768)
    assert MemoryBudget(micro_batch_tokens=16_384).forward(4_096) == (1, 16_384)  # short sequences: the budget
    assert MemoryBudget(micro_batch_size=2).forward(4_096) == (2, 4_096)
    kw = {"buffer_size_gb": 40.0, "kv_cache_mode": "persist", "capacity_gib": 139.0}
    a, b = estimate(SHAPE, long, **kw), estimate(SHAPE, packed, **kw)
    assert (b.micro_batch_size, b.sequence_length) == (1, 32_768)
    assert b.activations_gib == pytest.approx(a.activations_gib / 8) and b.logits_gib == pytest.approx(a.logits_gib / 8)
    with pytest.raises(ConfigError) as info:  # both would describe the forward: neither is silently ignored
        MemoryBudget(micro_batch_size=2, micro_batch_tokens=16_384)
    assert info.value.field == "micro_batch_tokens" and "micro_batch_size=2" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"on_exceed": "ignore"}, "on_exceed"),
        ({"margin_fraction": 1.0}, "margin_fraction"),
        ({"device_capacity_gib": 0}, "device_capacity_gib"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"micro_batch_tokens": 0}, "micro_batch_tokens"),
        ({"micro_batch_tokens": 1.5}, "micro_batch_tokens"),
    ],
)
def test_bad_budget_settings(kwargs, field):
    with pytest.raises(ConfigError) as info:
        MemoryBudget(**kwargs)
    assert info.value.field == field


def test_megatron_engine_checks_the_budget_before_it_builds(dist1, caplog):  # noqa: F811
    from colo_fsm.adapters.megatron import CharTokenizer, GenerationConfig, MegatronEngine

    tok = CharTokenizer()
    model = tiny(tok)
    over = MegatronEngine(model, tok, GenerationConfig(buffer_size_gb=4.0))
    over.memory_budget = MemoryBudget(device_capacity_gib=2.0, micro_batch_size=2)
    with pytest.raises(MemoryBudgetExceeded, match="buffer_size_gb <= 0.9") as info:
        over.bring_up()
    seq = over.max_sequence_length  # sequence_length=None: the engine's longest sequence
    assert f"one micro-batch of 2 x {seq:,} tokens" in str(info.value)
    assert not over.built
    fits = MegatronEngine(model, tok, GenerationConfig(buffer_size_gb=0.5))
    fits.memory_budget = MemoryBudget(device_capacity_gib=2.0, micro_batch_size=2)
    fits.bring_up()
    b = fits.memory_estimate.breakdown()
    n = sum(p.numel() for p in model.parameters())
    assert b["params_gib"] == pytest.approx(n * 4 / GIB) and b["kv_buffer_gib"] == 0.5 and b["capacity_gib"] == 2.0
    fits.shutdown()
    warned = MegatronEngine(model, tok, GenerationConfig(buffer_size_gb=4.0))
    warned.memory_budget = MemoryBudget(device_capacity_gib=2.0, on_exceed="warn")
    with caplog.at_level(logging.WARNING):
        warned.bring_up()
    assert warned.built and any("memory budget" in r.getMessage() for r in caplog.records)
    warned.shutdown()
    unstated = MegatronEngine(model, tok)  # a CPU model and no stated capacity: nothing to check against
    unstated.bring_up()
    assert unstated.memory_estimate is None
    unstated.shutdown()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_optimizer_and_gradient_terms_match_adamws_real_state(dist1, dtype):  # noqa: F811
    """The budget's optimizer-state and gradient terms against what torch AdamW (the trainer's optimizer)
    really holds after one step on a small megatron GPT: the bytes of every state tensor and every .grad."""
    import torch

    from colo_fsm.adapters.megatron import CharTokenizer
    from colo_fsm.adapters.megatron.memory import training_shape

    model = tiny(CharTokenizer()).to(getattr(torch, dtype))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    loss = sum((p.float() ** 2).sum() for p in params)
    loss.backward()
    optimizer.step()
    state_bytes = sum(
        t.numel() * t.element_size()
        for st in optimizer.state.values()
        for t in st.values()
        if torch.is_tensor(t) and t.dim() > 0  # the moments (the scalar step counters are a few bytes)
    )
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params)
    est = estimate(
        training_shape(model),
        MemoryBudget(sequence_length=8, micro_batch_size=1),
        buffer_size_gb=0.0,
        kv_cache_mode="persist",
        capacity_gib=80.0,
    )
    assert state_bytes > 0 and len(optimizer.state) == len(params)
    assert est.optimizer_gib * GIB == pytest.approx(state_bytes, rel=1e-9), (est.optimizer_gib * GIB, state_bytes)
    assert est.grads_gib * GIB == pytest.approx(grad_bytes, rel=1e-9), (est.grads_gib * GIB, grad_bytes)


def test_optimizer_shards_divides_the_optimizer_state_and_a_bad_count_is_refused():
    """megatron's distributed optimizer keeps 1/DP of the optimizer state on each rank: ``optimizer_shards``
    divides that term and no other; a count that is not a positive integer is refused, naming the field."""
    one = estimate(SHAPE, MemoryBudget(), buffer_size_gb=8.0, kv_cache_mode="persist", capacity_gib=80.0)
    four = estimate(
        SHAPE, MemoryBudget(optimizer_shards=4), buffer_size_gb=8.0, kv_cache_mode="persist", capacity_gib=80.0
    )
    assert four.optimizer_gib == pytest.approx(one.optimizer_gib / 4) == pytest.approx(1.0)
    assert four.total_gib == pytest.approx(one.total_gib - 3.0)
    for bad in (0, -2, 1.5, True, "4", None):
        with pytest.raises(ConfigError) as err:
            MemoryBudget(optimizer_shards=bad)
        assert err.value.field == "optimizer_shards" and err.value.value == bad, err.value


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parameters_megatrons_ddp_wrapped_are_priced_as_its_grad_buffer_and_optimizer_hold_them(dist1, dtype):  # noqa: F811
    """Parameters carrying megatron-core DDP's ``main_grad`` (here set by hand: its DDP needs CUDA; the GPU
    suite checks the real one) are priced at the grad buffer's dtype, and the optimizer as megatron's Adam holds
    it: two fp32 moments, plus an fp32 main copy of a 16-bit parameter."""
    import torch

    from colo_fsm.adapters.megatron import CharTokenizer
    from colo_fsm.adapters.megatron.memory import training_shape

    model = tiny(CharTokenizer()).to(getattr(torch, dtype))
    bare = training_shape(model)
    for p in model.parameters():
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
    wrapped = training_shape(model)
    nbytes = 4 if dtype == "float32" else 2
    assert (bare.grad_bytes, bare.optimizer_bytes_per_param) == (nbytes, 2 * nbytes)  # torch AdamW
    assert (wrapped.grad_bytes, wrapped.optimizer_bytes_per_param) == (4, 8 if dtype == "float32" else 12)
    assert wrapped.num_parameters == bare.num_parameters and wrapped.param_bytes == nbytes


def test_the_trainers_optimizer_shards_are_its_smallest_ddp_group_with_the_distributed_optimizer():
    """``MegatronTrainer.optimizer_shards`` on megatron DDP's buffers (stand-ins here: the DDP needs CUDA):
    1 without the distributed optimizer; with it, the smallest data-parallel group of any buffer, so an MoE
    expert's buffer (DP / EP ranks) is never undercounted."""
    from types import SimpleNamespace

    from colo_fsm.adapters.megatron.trainer import MegatronTrainer

    def trainer(distributed: bool, dense: list[int], experts: list[int]) -> MegatronTrainer:
        t = object.__new__(MegatronTrainer)
        buf = [SimpleNamespace(data_parallel_world_size=n) for n in dense]
        exp = [SimpleNamespace(data_parallel_world_size=n) for n in experts]
        t.ddp = SimpleNamespace(buffers=buf, expert_parallel_buffers=exp)
        t.config = SimpleNamespace(use_distributed_optimizer=distributed)
        return t

    assert trainer(False, [8], [2]).optimizer_shards == 1
    assert trainer(True, [8], []).optimizer_shards == 8
    assert trainer(True, [8, 8], [2]).optimizer_shards == 2
    assert trainer(True, [], []).optimizer_shards == 1
