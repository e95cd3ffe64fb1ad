"""Atomic distributed checkpoints: ``megatron.core.dist_checkpointing`` on GPUs, torch DCP on the CPU.

Two formats, one layout and one atomic protocol:

* ``megatron`` (default on CUDA): ``megatron.core.dist_checkpointing`` with the model's sharded state dict
  and the AdamW state mapped onto it (TP-aware, reshardable).
* ``dcp`` (default on the CPU): ``torch.distributed.checkpoint``. megatron-core 0.19.2's ``torch_dist``
  writer calls ``torch.cuda.synchronize()`` unconditionally (``FileSystemWriterAsync.preload_tensors``), so
  it cannot save without a GPU; DCP can. Tensors are keyed by tensor-parallel rank (data-parallel replicas
  share keys and are written once), so a ``dcp`` checkpoint loads at the same TP size it was saved with.

Layout under ``root``::

    step_00000006/        a complete dist_checkpointing directory (+ colo_fsm.json with step and version)
    latest                the name of the newest complete checkpoint (replaced atomically)

Every rank writes into ``.incomplete-step_XXXXXXXX``; only after the save's collectives have finished on
every rank does rank 0 rename it to its final name and then point ``latest`` at it. A crash mid-save leaves
an ``.incomplete-*`` folder that is never loaded and is removed by the next save of that step.

``extra_state`` (lifecycle step and weight version, replay-buffer contents, ...) is saved per rank as a
``ShardedObject``, so each rank gets its own contents back on load.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger

log = get_logger(__name__)

LATEST = "latest"
META = "colo_fsm.json"


@dataclass(frozen=True)
class CheckpointInfo:
    """A loaded checkpoint: where it was, its step and weight version, and this rank's extra state."""

    path: Path
    step: int
    weight_version: int
    extra_state: dict[str, Any]


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def step_dir_name(step: int) -> str:
    """Directory name of the checkpoint of ``step``."""
    return f"step_{step:08d}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (via ``latest``), or None."""
    root = Path(root)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    return path if (path / META).is_file() else None


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW state tensors (zeros) for parameters that have none, so a sharded map can be built."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state[p]
            if not st:
                st["step"] = torch.zeros((), dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _is_megatron_optimizer(optimizer: Any) -> bool:
    """megatron-core's optimizers (not torch ones) map their own state onto the model's sharded tensors."""
    return optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer)


OPTIMIZER_SHARDING = "dp_reshardable"
"""How megatron-core's distributed optimizer lays its state out in a checkpoint. megatron-core 0.19.2's default
(``fully_sharded_model_space``) builds flattened-range sharded tensors, which its own dist-checkpointing then
refuses ("ShardedTensor.flattened_range is not supported"); ``dp_reshardable`` saves each rank's buffers as
plain sharded tensors (fully parallel, reshardable along data parallelism only)."""


def optimizer_metadata(optimizer: Any) -> dict[str, str] | None:
    """The sharding metadata megatron-core's optimizer is asked for: :data:`OPTIMIZER_SHARDING` when it is (or
    chains) a distributed optimizer, else None (the plain optimizers have one layout)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    inner = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    if any(isinstance(o, DistributedOptimizer) for o in inner):
        return {"distrib_optim_sharding_type": OPTIMIZER_SHARDING}
    return None


def _sharded_state(
    model: Any,
    optimizer: Any,
    extra_state: Mapping[str, Any] | None,
    meta: Mapping[str, Any],
    *,
    is_loading: bool = False,
) -> dict[str, Any]:
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    rank, world = _world()
    model_sd = model.sharded_state_dict(prefix="model.")
    state: dict[str, Any] = {"model": model_sd, "colo_fsm": dict(meta)}
    if _is_megatron_optimizer(optimizer):  # megatron-core's own mapping (fp32 main params, sharded state)
        state["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata=optimizer_metadata(optimizer)
        )
    elif optimizer is not None:
        _init_optimizer_state(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        osd = optimizer.state_dict()
        steps = {float(s["step"]) for s in osd["state"].values() if "step" in s}
        if len(steps) > 1:
            raise ConfigError("optimizer.step", sorted(steps), "one step count shared by every parameter")
        optim_state_to_sharding_state(osd, get_param_id_to_sharded_param_map(model_sd, params), exclude_keys=("step",))
        osd["common_step"] = steps.pop() if steps else 0.0
        state["optimizer"] = osd
    state["extra_state"] = ShardedObject(
        "colo_fsm.extra_state", dict(extra_state or {}), (world,), (rank,), replica_id=0
    )
    return state


FORMATS = ("auto", "megatron", "dcp")


def resolve_format(fmt: str, model: Any) -> str:
    """``auto`` -> ``megatron`` when the model is on CUDA, else ``dcp``; other values are checked."""
    if fmt not in FORMATS:
        raise ConfigError("checkpoint_format", fmt, f"one of {FORMATS}")
    if fmt != "auto":
        return fmt
    return "megatron" if next(model.parameters()).is_cuda else "dcp"


def _tp_rank() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_rank() if ps.model_parallel_is_initialized() else 0


def _dcp_state(
    model: Any, optimizer: torch.optim.Optimizer | None, extra_state: Mapping[str, Any] | None
) -> dict[str, Any]:
    rank, _ = _world()
    tp = _tp_rank()
    state: dict[str, Any] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for k, v in model.state_dict().items():
        if torch.is_tensor(v):
            state[f"tp{tp}.model.{k}"] = v
    if optimizer is not None:
        _init_optimizer_state(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                for key, v in optimizer.state[p].items():
                    if torch.is_tensor(v):
                        state[f"tp{tp}.optimizer.{names[id(p)]}.{key}"] = v
    # one leaf object per rank (DCP would flatten a nested mapping into keys the loader cannot predict)
    state[f"rank{rank}.extra_state"] = pickle.dumps(dict(extra_state or {}))
    return state


def _dcp_extra(state: Mapping[str, Any]) -> dict[str, Any]:
    rank, _ = _world()
    raw = state.get(f"rank{rank}.extra_state")
    return dict(pickle.loads(raw)) if raw else {}


def save_checkpoint(
    root: str | Path,
    *,
    step: int,
    weight_version: int,
    model: Any,
    optimizer: Any = None,
    extra_state: Mapping[str, Any] | None = None,
    checkpoint_format: str = "auto",
) -> Path:
    """Save model, optimizer and per-rank ``extra_state`` atomically; every rank must call it. Returns the
    final directory."""
    rank, world = _world()
    fmt = resolve_format(checkpoint_format, model)
    if fmt == "dcp" and _is_megatron_optimizer(optimizer):
        raise ConfigError("checkpoint_format", "dcp", "'megatron' or 'auto' with megatron-core's optimizer")
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".incomplete-{final.name}"
    t0 = time.perf_counter()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    meta = {"step": step, "weight_version": weight_version, "world_size": world, "format": fmt}
    if fmt == "megatron":
        from megatron.core import dist_checkpointing

        dist_checkpointing.save(_sharded_state(model, optimizer, extra_state, meta), str(tmp))
    else:
        import torch.distributed.checkpoint as dcp

        dcp.save(_dcp_state(model, optimizer, extra_state), checkpoint_id=str(tmp))
    _barrier()  # every rank's shards are written before anything is renamed
    if rank == 0:
        (tmp / META).write_text(json.dumps({**meta, "saved_at": time.time()}), encoding="utf-8")
        if final.exists():  # re-saving a step (e.g. after --resume): replace the old one whole
            trash = root / f".old-{final.name}-{os.getpid()}"
            final.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)
        tmp.rename(final)
        pointer_tmp = root / f".{LATEST}.tmp"
        pointer_tmp.write_text(final.name, encoding="utf-8")
        os.replace(pointer_tmp, root / LATEST)
    _barrier()
    log.info(
        "checkpoint saved: %s (step %d, weight version %d) in %.2fs",
        final,
        step,
        weight_version,
        time.perf_counter() - t0,
    )
    return final


def load_checkpoint(root_or_path: str | Path, *, model: Any, optimizer: Any = None) -> CheckpointInfo:
    """Load the checkpoint at ``root_or_path`` (a checkpoint directory, or a root whose ``latest`` is used)
    into ``model`` and ``optimizer`` in place; returns its step, weight version and this rank's extra state."""
    p = Path(root_or_path)
    path = p if (p / META).is_file() else latest_checkpoint(p)
    if path is None:
        raise ConfigError("checkpoint", str(root_or_path), "a complete checkpoint directory or a root with 'latest'")
    meta = json.loads((path / META).read_text(encoding="utf-8"))
    _, world = _world()
    if meta.get("world_size") != world:
        raise ConfigError(
            "world_size", world, f"{meta.get('world_size')} (the world size the checkpoint was saved with)"
        )
    if meta.get("format", "megatron") == "dcp":
        import torch.distributed.checkpoint as dcp

        if _is_megatron_optimizer(optimizer):
            raise ConfigError("checkpoint", str(path), "a 'megatron' format checkpoint for megatron-core's optimizer")

        state = _dcp_state(model, optimizer, {})
        dcp.load(state, checkpoint_id=str(path))
        extra = _dcp_extra(state)  # tensors were loaded in place
    else:
        from megatron.core import dist_checkpointing

        template = _sharded_state(
            model, optimizer, {}, {"step": 0, "weight_version": 0, "world_size": world}, is_loading=True
        )
        loaded = dist_checkpointing.load(template, str(path))
        res = model.load_state_dict(_strip(loaded["model"], "model."), strict=False)
        missing = [k for k in res.missing_keys if not k.endswith("_extra_state")]
        if missing:
            raise ConfigError(
                "checkpoint", str(path), f"a checkpoint holding every model weight (missing {missing[:3]})"
            )
        if _is_megatron_optimizer(optimizer):
            optimizer.load_state_dict(loaded["optimizer"])
        elif optimizer is not None:
            osd = loaded["optimizer"]
            step = osd.pop("common_step", 0.0)
            for st in osd["state"].values():
                st["step"] = torch.tensor(float(step), dtype=torch.float32)
            optimizer.load_state_dict(osd)
        extra = loaded.get("extra_state") or {}
    log.info("checkpoint loaded: %s (step %d, weight version %d)", path, meta["step"], meta["weight_version"])
    return CheckpointInfo(
        path=path, step=int(meta["step"]), weight_version=int(meta["weight_version"]), extra_state=dict(extra)
    )


def _strip(sd: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {(k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in sd.items()}


__all__ = [
    "FORMATS",
    "OPTIMIZER_SHARDING",
    "CheckpointInfo",
    "latest_checkpoint",
    "load_checkpoint",
    "optimizer_metadata",
    "resolve_format",
    "save_checkpoint",
    "step_dir_name",
]
