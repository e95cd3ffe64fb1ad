"""torch.distributed and megatron-core parallel state: gloo on the CPU, NCCL on GPUs."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Concatenate

from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class DistributedSetup:
    """Where this process sits: global rank, world size, local rank, backend and torch device string."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str
    tensor_model_parallel_size: int
    data_parallel_size: int


def free_port() -> int:
    """An unused TCP port on localhost (for single-node rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(name, raw, "an integer") from None


def init_distributed(
    tensor_model_parallel_size: int = 1,
    *,
    device: str = "cpu",
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
    timeout_s: float = 600.0,
    expert_model_parallel_size: int = 1,
) -> DistributedSetup:
    """Initialize ``torch.distributed`` (gloo for ``device="cpu"``, NCCL for ``"cuda"``) and megatron-core's
    model-parallel groups with ``tensor_model_parallel_size`` (and ``expert_model_parallel_size`` for MoE models,
    carved out of the data-parallel ranks); everything left over is data parallel.

    Rank and world size come from the arguments, else ``RANK``/``WORLD_SIZE`` (torchrun), else a world of
    one. Already-initialized state is reused; megatron's groups are rebuilt if the TP or EP size differs.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if device not in ("cpu", "cuda"):
        raise ConfigError("device", device, "'cpu' or 'cuda'")
    tp = tensor_model_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError("tensor_model_parallel_size", tp, "a positive integer")
    local_rank = _env_int("LOCAL_RANK", 0)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device", device, "'cpu' on a machine without a CUDA device")
        torch.cuda.set_device(local_rank)
    backend = "nccl" if device == "cuda" else "gloo"
    if not dist.is_initialized():
        rank = _env_int("RANK", 0) if rank is None else rank
        world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        if init_method is None:
            if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
                init_method = "env://"
            elif world_size == 1:
                init_method = f"tcp://127.0.0.1:{free_port()}"
            else:
                raise ConfigError("init_method", None, "MASTER_ADDR/MASTER_PORT or an init_method for >1 rank")
        kwargs: dict = {}
        if device == "cuda":
            kwargs["device_id"] = torch.device("cuda", local_rank)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size % tp:
        raise ConfigError("tensor_model_parallel_size", tp, f"a divisor of the world size {world_size}")
    ep = expert_model_parallel_size
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or world_size % ep:
        raise ConfigError("expert_model_parallel_size", ep, f"a positive divisor of the world size {world_size}")
    if ps.model_parallel_is_initialized() and (
        ps.get_tensor_model_parallel_world_size() != tp or ps.get_expert_model_parallel_world_size() != ep
    ):
        ps.destroy_model_parallel()
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    setup = DistributedSetup(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        backend=backend,
        device=f"cuda:{local_rank}" if device == "cuda" else "cpu",
        tensor_model_parallel_size=tp,
        data_parallel_size=world_size // tp,
    )
    log.info(
        "distributed: rank %d/%d backend=%s tp=%d dp=%d device=%s",
        rank,
        world_size,
        backend,
        tp,
        setup.data_parallel_size,
        setup.device,
    )
    return setup


def rank_device_index(device: Any) -> int | None:
    """The CUDA device index this rank owns for ``device`` (a ``torch.device`` or string): its own index,
    else ``LOCAL_RANK`` for a bare ``"cuda"``; None for a non-CUDA device."""
    import torch

    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type != "cuda":
        return None
    return dev.index if dev.index is not None else _env_int("LOCAL_RANK", 0)


def device_context(device: Any) -> contextlib.AbstractContextManager[Any]:
    """``torch.cuda.device(<this rank's index>)`` for a CUDA ``device``; a no-op context on the CPU.

    The adapters' entry points are called from threads that never called ``torch.cuda.set_device`` (the
    collector's pool, the AsyncLifecycle worker, the HTTP server's threads): the current device there is
    cuda:0, so on rank >= 1 kernels, allocations and ``torch.cuda.*`` calls would land on the wrong GPU.
    """
    index = rank_device_index(device)
    if index is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(index)


def on_own_device[**P, R](method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """Decorate a method of an object with a ``device`` attribute: it runs under :func:`device_context`."""

    @functools.wraps(method)
    def wrapper(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with device_context(self.device):
            return method(self, *args, **kwargs)

    return wrapper


def shutdown_distributed() -> None:
    """Destroy megatron-core's groups and the default process group (if initialized)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


__all__ = [
    "DistributedSetup",
    "device_context",
    "free_port",
    "init_distributed",
    "on_own_device",
    "rank_device_index",
    "shutdown_distributed",
]
