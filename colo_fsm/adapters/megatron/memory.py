"""The memory budget of the megatron adapter: the shared model's training footprint + the engine's KV buffer.

:func:`training_shape` reads one rank's footprint off the model (parameters and their dtype, layers, hidden
size, heads, vocabulary, TP) as :class:`~colo_fsm.adapters.megatron.trainer.MegatronTrainer` trains it: on
megatron-core's DDP and optimizer (its ``megatron`` backend, the default on CUDA) gradients in DDP's grad buffer
and a mixed-precision Adam; on the ``torch`` backend torch AdamW. :func:`check_engine_budget` runs before
``MegatronEngine.bring_up`` builds anything, with ``engine.memory_budget`` (a
:class:`~colo_fsm.guards.memory.MemoryBudget`; on CUDA a default one, against the device's total memory).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from colo_fsm.adapters.megatron.mode import _unwrap
from colo_fsm.guards.memory import GIB, MemoryBudget, MemoryEstimate, TrainingShape, check_budget, estimate

_FP32_BYTES = 4


def training_shape(model: Any) -> TrainingShape:
    """One rank's training footprint of ``model`` (a megatron-core GPT, possibly wrapped), by how it is trained.

    Parameters that megatron-core's DDP has wrapped carry a ``main_grad`` (a view of its grad buffer): their
    gradients are priced at that buffer's dtype (fp32 as ``MegatronTrainer`` configures it) and the optimizer as
    megatron's Adam holds it, two fp32 moments plus an fp32 main copy of a 16-bit parameter (12 bytes a bf16
    parameter, 8 an fp32 one). Other parameters are priced as torch AdamW holds them: a gradient and two
    moments in the parameter's dtype. Build the trainer before the engine's bring-up, which checks this
    budget: before DDP wraps the model its parameters read as torch AdamW's, the smaller footprint."""
    inner, _ = _unwrap(model)
    cfg = inner.config
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    nbytes = params[0].element_size() if params else 2
    on_cuda = bool(params) and params[0].is_cuda
    main_grad = getattr(params[0], "main_grad", None) if params else None
    if main_grad is not None:  # megatron-core's DDP and optimizer
        grad_bytes = main_grad.element_size()
        optimizer_bytes = 2.0 * _FP32_BYTES + (_FP32_BYTES if nbytes < _FP32_BYTES else 0)
    else:  # torch AdamW
        grad_bytes = nbytes
        optimizer_bytes = 2.0 * nbytes
    return TrainingShape(
        num_parameters=n,
        param_bytes=nbytes,
        grad_bytes=grad_bytes,
        optimizer_bytes_per_param=optimizer_bytes,
        num_layers=int(cfg.num_layers),
        hidden_size=int(cfg.hidden_size),
        num_attention_heads=int(cfg.num_attention_heads),
        vocab_size=int(getattr(inner, "vocab_size", 0) or 0),
        tensor_parallel=int(getattr(cfg, "tensor_model_parallel_size", 1) or 1),
        flash_attention=on_cuda,  # SDPA materializes the attention scores on the CPU only
    )


def device_capacity_gib(device: Any) -> float | None:
    """Total memory of ``device`` in GiB (None for a non-CUDA device, or where CUDA is not available)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return float(torch.cuda.mem_get_info(dev)[1]) / GIB


def check_engine_budget(engine: Any) -> MemoryEstimate | None:
    """Check ``engine.memory_budget`` before bring-up; returns the estimate (None when there is no capacity to
    check against: a CPU model without a stated ``device_capacity_gib``). Raises
    :class:`~colo_fsm.errors.MemoryBudgetExceeded` over budget (or warns, ``on_exceed="warn"``)."""
    budget = getattr(engine, "memory_budget", None)
    capacity = budget.device_capacity_gib if budget is not None else None
    if capacity is None:
        capacity = device_capacity_gib(engine.device)
    if capacity is None:
        return None
    budget = budget or MemoryBudget()
    if budget.sequence_length is None:
        budget = dataclasses.replace(budget, sequence_length=int(engine.max_sequence_length))
    est = estimate(
        training_shape(engine.model),
        budget,
        buffer_size_gb=float(engine.config.buffer_size_gb),
        kv_cache_mode=str(engine.config.kv_cache_mode),
        capacity_gib=capacity,
    )
    return check_budget(est, budget)


__all__ = ["check_engine_budget", "device_capacity_gib", "training_shape"]
