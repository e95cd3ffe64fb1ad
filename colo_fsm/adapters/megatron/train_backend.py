"""megatron-core's own training machinery for :class:`~colo_fsm.adapters.megatron.trainer.MegatronTrainer` on CUDA.

* :func:`wrap_ddp`: megatron-core's ``DistributedDataParallel`` (contiguous bucketed gradient buffers, one
  reduction per bucket, overlapped with the backward when ``overlap_grad_reduce``; the distributed optimizer's
  reduce-scatter / all-gather with ``use_distributed_optimizer``; param-gather forward pre-hooks with
  ``overlap_param_gather``). It needs CUDA: its construction fails without a GPU ("Found no NVIDIA driver"),
  which is why the CPU path keeps a torch optimizer with an explicit all-reduce.
* :func:`build_optimizer`: ``get_megatron_optimizer`` with an ``OptimizerConfig`` (Adam with decoupled weight
  decay, fp32 main parameters for a bf16 model, global grad-norm clipping over the model-parallel group).
* :func:`wire_schedule`: sets the hooks megatron-core's forward-backward schedule calls on the model config
  (``no_sync_func``, ``finalize_model_grads_func``, ``grad_scale_func``), as Megatron-LM's training loop does.
"""

from __future__ import annotations

from typing import Any

import torch

BACKENDS = ("auto", "megatron", "torch")


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto`` -> ``megatron`` on CUDA, ``torch`` on the CPU (megatron-core's DDP needs CUDA)."""
    if backend != "auto":
        return backend
    return "megatron" if device.type == "cuda" else "torch"


def wrap_ddp(model: Any, config: Any) -> Any:
    """Wrap ``model`` in megatron-core's ``DistributedDataParallel`` per ``config`` (a ``TrainerConfig``).

    Wrap before the engine captures CUDA graphs: with the distributed optimizer the parameters move into DDP's
    contiguous buffer, and a graph captured earlier would read the old storage.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=config.overlap_grad_reduce,
        overlap_param_gather=config.overlap_param_gather,
        use_distributed_optimizer=config.use_distributed_optimizer,
        bucket_size=config.ddp_bucket_size,
    )
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)


def build_optimizer(ddp: Any, config: Any) -> Any:
    """megatron-core's optimizer for ``ddp`` (``get_megatron_optimizer``), from a ``TrainerConfig``."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    mcfg = ddp.module.config
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=config.lr,
        min_lr=config.lr,
        weight_decay=config.weight_decay,
        adam_beta1=config.betas[0],
        adam_beta2=config.betas[1],
        clip_grad=config.grad_clip,
        bf16=bool(getattr(mcfg, "bf16", False)),
        params_dtype=getattr(mcfg, "params_dtype", torch.float32),
        use_distributed_optimizer=config.use_distributed_optimizer,
        overlap_param_gather=config.overlap_param_gather,
    )
    return get_megatron_optimizer(opt_config, [ddp])


def wire_schedule(ddp: Any, optimizer: Any, config: Any) -> None:
    """Set the schedule hooks on the model config: grad sync deferred to the last micro-batch when
    overlapping, gradients finalized (DP reduction) after the last backward, loss scaled by the optimizer."""
    from megatron.core.distributed import finalize_model_grads

    mcfg = ddp.module.config
    mcfg.no_sync_func = ddp.no_sync if config.overlap_grad_reduce else None
    mcfg.grad_sync_func = None
    mcfg.param_sync_func = None
    mcfg.finalize_model_grads_func = finalize_model_grads
    mcfg.grad_scale_func = optimizer.scale_loss


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a megatron-core optimizer (chained or not), or ``[optimizer]`` itself."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    parts = chained if chained is not None else [optimizer]
    out: list[torch.optim.Optimizer] = []
    for p in parts:
        inner = getattr(p, "optimizer", None)
        if isinstance(inner, torch.optim.Optimizer):
            out.append(inner)
    return out


__all__ = ["BACKENDS", "build_optimizer", "resolve_backend", "torch_optimizers", "wire_schedule", "wrap_ddp"]
