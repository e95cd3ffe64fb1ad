"""One decode schedule for a tensor-parallel group: the group's leader plans each engine-loop iteration.

Tensor-parallel peers run *one* forward together (every layer all-reduces or all-gathers over the TP group), so
their engine loops must issue the same sequence of steps over the same requests. Each rank's
:class:`~colo_fsm.adapters.batching.ContinuousBatcher` decides on its own when to admit a request and when to
take a suspend; left alone, two TP ranks drift by a step (one rank parks after step k, its peer is already in
step k+1 waiting in the TP collective) and the next handoff barrier times out: a desync (see
:attr:`colo_fsm.states.rules.LifecycleRule.ONE_COMMUNICATOR`). With a :class:`Lockstep`, every iteration that
touches the backend first agrees on a :class:`StepPlan` (the leader's): which command runs, or which
requests are admitted (by request id) and aborted before one decode step. Followers wait for the planned
requests and commands to reach them: submissions and control calls must be SPMD (the same requests in the
same order, the same suspend/resume/shutdown on every rank of the group), as a torchrun program's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import ConfigError

KINDS = ("step", "suspend", "resume", "shutdown", "noop")
"""What an iteration does: one decode step (after admissions/aborts), a control command, or only aborts."""


@dataclass(frozen=True)
class StepPlan:
    """One engine-loop iteration of the whole TP group: its kind, the ids admitted and aborted before it."""

    kind: str
    admit: tuple[int, ...] = ()
    abort: tuple[int, ...] = ()
    drain: bool = False  # a drain-mode suspend (the leader waited for the admitted requests)

    def to_ints(self, width: int) -> list[int]:
        """Fixed-width wire form: ``[kind, drain, n_admit, n_abort, admit..., abort..., 0 padding]``."""
        body = [KINDS.index(self.kind), int(self.drain), len(self.admit), len(self.abort), *self.admit, *self.abort]
        if len(body) > width:
            raise ConfigError("lockstep plan", len(body), f"at most {width} integers (raise max_active_requests)")
        return body + [0] * (width - len(body))

    @classmethod
    def from_ints(cls, values: Sequence[int]) -> StepPlan:
        """Inverse of :meth:`to_ints`."""
        kind, drain, na, nb = (int(v) for v in values[:4])
        admit = tuple(int(v) for v in values[4 : 4 + na])
        abort = tuple(int(v) for v in values[4 + na : 4 + na + nb])
        return cls(KINDS[kind], admit, abort, bool(drain))


@runtime_checkable
class Lockstep(Protocol):
    """Agree on one :class:`StepPlan` per iteration: every rank passes its own and gets the leader's."""

    leader: bool
    width: int

    def agree(self, plan: StepPlan) -> StepPlan:
        """Collective over the group: returns the leader's plan on every rank."""


class TorchLockstep:
    """:class:`Lockstep` over a ``torch.distributed`` group: one broadcast of ``width`` int64 from ``src``.

    ``device`` is where the plan tensor lives (this rank's GPU for NCCL, the CPU for gloo). The broadcast is
    bounded by the process group's timeout.
    """

    def __init__(self, group: Any, *, src: int, device: Any = "cpu", width: int = 256) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("process_group", group, "an initialized torch.distributed process group")
        if isinstance(width, bool) or not isinstance(width, int) or width < 8:
            raise ConfigError("width", width, "an integer >= 8")
        self.group = group
        self.src = int(src)
        self.leader = dist.get_rank() == self.src
        self.width = width
        self.device = torch.device(device)
        self.rounds = 0

    def agree(self, plan: StepPlan) -> StepPlan:
        import torch
        import torch.distributed as dist

        t = torch.tensor(plan.to_ints(self.width), dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=self.src, group=self.group)
        self.rounds += 1
        return plan if self.leader else StepPlan.from_ints(t.cpu().tolist())


def tensor_parallel_lockstep(device: Any, *, max_active_requests: int) -> TorchLockstep | None:
    """A :class:`TorchLockstep` over megatron-core's TP group when TP > 1 (None for TP = 1 or no groups)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_tensor_model_parallel_world_size() == 1:
        return None
    return TorchLockstep(
        ps.get_tensor_model_parallel_group(),
        src=ps.get_tensor_model_parallel_src_rank(),
        device=device,
        width=4 + 2 * max_active_requests + 64,
    )


__all__ = ["KINDS", "Lockstep", "StepPlan", "TorchLockstep", "tensor_parallel_lockstep"]
