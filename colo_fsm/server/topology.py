"""Where the HTTP servers of a model-parallel run go: one per tensor-parallel group, on its first rank.

Tensor-parallel peers decode one batch together, so a request must enter every rank of its group. The group's
first rank (the lockstep's leader) runs the group's one OpenAI-compatible server and submits each request with
``feed=True``; the lockstep carries it to the other ranks in the plan that admits it
(:mod:`colo_fsm.adapters.lockstep`). ``dp_openai_server_base_urls`` then has one URL per data-parallel replica.

:func:`check_serving_layout` is run at bring-up over what every rank reports (one all-gather), so every rank
refuses the same layout with the same :class:`~colo_fsm.errors.ServingTopologyError`, never one rank alone
(which would leave its peers waiting in the next collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from colo_fsm.errors import ServingTopologyError


@dataclass(frozen=True)
class ServingRole:
    """What one rank brings to serving: whether it asks to serve, its tensor-parallel group (global ranks) and
    whether requests submitted on it reach the group's other ranks (a lockstep that carries them)."""

    rank: int
    serve: bool
    group: tuple[int, ...]
    feeds_group: bool
    pipeline_parallel: int = 1

    @property
    def leader(self) -> bool:
        """True on the group's first rank, where the group's server runs."""
        return self.rank == self.group[0]

    @property
    def runs_server(self) -> bool:
        """Whether this rank starts an HTTP server (its group serves and it is the group's first rank)."""
        return self.serve and self.leader


def _parallel_groups() -> tuple[int, int, tuple[int, ...], int]:
    """(rank, world size, this rank's tensor-parallel group, pipeline-parallel size) from torch.distributed and
    megatron-core's groups when they are initialized, else a world of one."""
    try:
        import torch.distributed as dist
    except ImportError:  # the core install: no torch, one rank
        return 0, 1, (0,), 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1, (0,), 1
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        from megatron.core import parallel_state as ps
    except ImportError:
        return rank, world, (rank,), 1
    if not ps.model_parallel_is_initialized():
        return rank, world, (rank,), 1
    group = tuple(int(r) for r in dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()))
    return rank, world, tuple(sorted(group)), int(ps.get_pipeline_model_parallel_world_size())


def serving_role(serve: bool, generator: Any) -> ServingRole:
    """This rank's :class:`ServingRole`: ``serve`` as asked, the groups from torch.distributed / megatron-core,
    and ``generator.feeds_tensor_parallel_group`` (False when the engine does not say)."""
    rank, _world, group, pp = _parallel_groups()
    feeds = len(group) == 1 or bool(getattr(generator, "feeds_tensor_parallel_group", False))
    return ServingRole(rank, bool(serve), group, feeds, pp)


def gather_roles(role: ServingRole, group: Any = None) -> list[ServingRole]:
    """Every rank's role (``torch.distributed.all_gather_object`` when initialized, else just ``role``)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - the core install has one rank
        return [role]
    if not (dist.is_available() and dist.is_initialized()):
        return [role]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, asdict(role), group=group)
    return [ServingRole(**{**d, "group": tuple(d["group"])}) for d in out]


def check_serving_layout(roles: Sequence[ServingRole]) -> None:
    """Raise :class:`ServingTopologyError` (the same on every rank) for a layout whose requests cannot route."""
    by_rank = {r.rank: r for r in roles}
    for r in sorted(roles, key=lambda x: x.rank):
        peers = [by_rank[p] for p in r.group if p in by_rank]
        if not r.serve:
            continue
        if r.pipeline_parallel > 1:
            raise ServingTopologyError(
                "pipeline_model_parallel_size",
                r.pipeline_parallel,
                f"1 when serving (rank {r.rank}): requests reach only the tensor-parallel group through the lockstep",
            )
        mixed = [p.rank for p in peers if not p.serve]
        if mixed:
            where = "its first rank" if mixed[0] == r.group[0] else f"rank {mixed[0]}"
            raise ServingTopologyError(
                "serve",
                True,
                f"the same value on every rank of the tensor-parallel group {list(r.group)} (rank {r.rank} asks "
                f"for a server, {where} does not): the group's one server runs on its first rank, rank "
                f"{r.group[0]}, and feeds the others; a server on a follower cannot route",
            )
        first = by_rank.get(r.group[0])
        if len(r.group) > 1 and first is not None and not first.feeds_group:
            raise ServingTopologyError(
                "tp_lockstep",
                False,
                f"True when the tensor-parallel group {list(r.group)} serves HTTP: its requests reach ranks "
                f"{list(r.group[1:])} only through the lockstep (GenerationConfig(tp_lockstep=True))",
            )


__all__ = ["ServingRole", "check_serving_layout", "gather_roles", "serving_role"]
