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

A request submitted on the leader alone (``submit(..., feed=True)``: what the group's one HTTP server does)
travels *in* the plan that admits it (:class:`CarriedRequest`): followers add the same request to their engine
without any submission of their own. Such requests take ids from their own range (:data:`FEED_ID_BASE` up), so
the ids of SPMD submissions stay the same on every rank. A row a rank ends by its own decision (a stop token,
``max_tokens``, ``on_token``) leaves every backend of the group together, through the leader's next plan.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import ConfigError
from colo_fsm.guards.barrier import wait_for

KINDS = ("step", "suspend", "resume", "shutdown", "noop")
"""What an iteration does: one decode step (after admissions/aborts), a control command, or only aborts."""


HEADER = 5
"""Integers before the ids in a plan's wire form: kind, drain, admitted count, aborted count, payload length."""

LOCKSTEP_HEARTBEAT_S = 5.0
"""An idle leader plans a noop this often: followers wait for the leader's plan inside the agreement itself."""

FEED_ID_BASE = 1 << 48
"""Ids of requests fed by the leader alone start here (SPMD submissions count from 0 on every rank)."""


def room_for(width: int) -> int:
    """How many ids one list (admitted or aborted) of a plan may hold at wire width ``width``."""
    return max(0, (width - HEADER) // 2)


def _float_bits(x: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", float(x)))[0])


def _bits_float(i: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", int(i)))[0])


def _mode_index(mode: str) -> int:
    from colo_fsm.adapters.engine.options import LogprobsMode  # imported late: the engine imports this module

    return [m.value for m in LogprobsMode].index(mode)


def _mode_name(index: int) -> str:
    from colo_fsm.adapters.engine.options import LogprobsMode

    return [m.value for m in LogprobsMode][index]


@dataclass(frozen=True)
class CarriedRequest:
    """A request submitted on the group's leader only, carried to the followers in the plan that admits it."""

    request_id: int
    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    top_logprobs: int = 0
    stop_token_ids: tuple[int, ...] = ()
    priority: int = 1
    logprobs_mode: str = "raw"  # a LogprobsMode value

    def to_ints(self) -> list[int]:
        """Wire form: fixed fields, then the prompt and the stop ids (floats as their IEEE-754 bits)."""
        return [
            _mode_index(self.logprobs_mode),
            self.request_id,
            self.max_tokens,
            _float_bits(self.temperature),
            _float_bits(self.top_p),
            self.top_k,
            -1 if self.seed is None else self.seed,
            self.top_logprobs,
            self.priority,
            len(self.prompt_ids),
            len(self.stop_token_ids),
            *self.prompt_ids,
            *self.stop_token_ids,
        ]

    @classmethod
    def from_ints(cls, v: Sequence[int], at: int = 0) -> tuple[CarriedRequest, int]:
        """Decode one request starting at ``v[at]``; returns it and the index after it."""
        mode, rid, mt, temp, top_p, top_k, seed, tl, prio, n_p, n_s = (int(x) for x in v[at : at + 11])
        p0 = at + 11
        req = cls(
            rid,
            tuple(int(x) for x in v[p0 : p0 + n_p]),
            mt,
            _bits_float(temp),
            _bits_float(top_p),
            top_k,
            None if seed < 0 else seed,
            tl,
            tuple(int(x) for x in v[p0 + n_p : p0 + n_p + n_s]),
            prio,
            _mode_name(mode),
        )
        return req, p0 + n_p + n_s


@dataclass(frozen=True)
class StepPlan:
    """One engine-loop iteration of the whole TP group: its kind, the ids admitted and aborted before it, and
    the requests among the admitted ones that only the leader has (``carried``)."""

    kind: str
    admit: tuple[int, ...] = ()
    abort: tuple[int, ...] = ()
    drain: bool = False  # a drain-mode suspend (the leader waited for the admitted requests)
    carried: tuple[CarriedRequest, ...] = ()

    def payload(self) -> list[int]:
        """The carried requests' wire form (empty when there are none)."""
        return [x for r in self.carried for x in r.to_ints()]

    def to_ints(self, width: int) -> list[int]:
        """Wire form: ``width`` integers ``[kind, drain, n_admit, n_abort, n_payload, admit..., abort..., 0...]``,
        then the ``n_payload`` integers of the carried requests (a second message over a real group)."""
        payload = self.payload()
        head = [KINDS.index(self.kind), int(self.drain), len(self.admit), len(self.abort), len(payload)]
        body = [*head, *self.admit, *self.abort]
        if len(body) > width:
            raise ConfigError("lockstep plan", len(body), f"at most {width} integers (raise max_active_requests)")
        return body + [0] * (width - len(body)) + payload

    @classmethod
    def from_ints(cls, values: Sequence[int]) -> StepPlan:
        """Inverse of :meth:`to_ints` (the payload is the last ``n_payload`` integers)."""
        kind, drain, na, nb, npay = (int(v) for v in values[:HEADER])
        admit = tuple(int(v) for v in values[HEADER : HEADER + na])
        abort = tuple(int(v) for v in values[HEADER + na : HEADER + na + nb])
        payload = list(values[len(values) - npay :]) if npay else []
        carried: list[CarriedRequest] = []
        at = 0
        while at < len(payload):
            req, at = CarriedRequest.from_ints(payload, at)
            carried.append(req)
        return cls(KINDS[kind], admit, abort, bool(drain), tuple(carried))


@runtime_checkable
class Lockstep(Protocol):
    """Agree on one :class:`StepPlan` per iteration: every rank passes its own and gets the leader's."""

    leader: bool
    width: int

    def agree(self, plan: StepPlan) -> StepPlan:
        """Collective over the group: returns the leader's plan on every rank."""


class TorchLockstep:
    """:class:`Lockstep` over a ``torch.distributed`` group: one broadcast of ``width`` int64 from ``src``, and a
    second one with the carried requests when the plan admits any.

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
        self._held: list[Any] = []  # the last round's work handles (see wait_for)

    def agree(self, plan: StepPlan) -> StepPlan:
        import torch
        import torch.distributed as dist

        sends = dist.get_rank() == self.src
        wire = plan.to_ints(self.width) if sends else [0] * self.width
        head = torch.tensor(wire[: self.width], dtype=torch.int64, device=self.device)
        held = [wait_for(dist.broadcast(head, src=self.src, group=self.group, async_op=True))]
        self.rounds += 1
        values = head.cpu().tolist()
        npay = int(values[HEADER - 1])
        if npay:  # carried requests: a second broadcast, sized by the header every rank now has
            body = torch.tensor(wire[self.width :] if sends else [0] * npay, dtype=torch.int64, device=self.device)
            held.append(wait_for(dist.broadcast(body, src=self.src, group=self.group, async_op=True)))
            values += body.cpu().tolist()
        self._held = held
        return plan if self.leader else StepPlan.from_ints(values)


def tensor_parallel_lockstep(device: Any, *, max_active_requests: int) -> TorchLockstep | None:
    """A :class:`TorchLockstep` for megatron-core's TP group when TP > 1 (None for TP = 1 or no groups).

    The plans travel on a gloo group of their own over the same ranks (CPU tensors; ``device`` is not used for
    them): a follower waits for the leader's next plan inside that broadcast, even while the model's own TP
    communicator trains, which a pending collective on the TP group itself would corrupt. Every rank must call
    this, in the same order (creating the groups is a collective over the world).
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_tensor_model_parallel_world_size() == 1:
        return None
    mine = sorted(int(r) for r in dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()))
    groups: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(groups, mine)
    plan_group: Any = None
    for ranks in sorted({tuple(g) for g in groups}):  # every rank creates every group, in one order
        g = dist.new_group(list(ranks), backend="gloo")
        if list(ranks) == mine:
            plan_group = g
    return TorchLockstep(plan_group, src=mine[0], device="cpu", width=HEADER + 2 * max_active_requests + 64)


__all__ = [
    "FEED_ID_BASE",
    "HEADER",
    "KINDS",
    "LOCKSTEP_HEARTBEAT_S",
    "CarriedRequest",
    "Lockstep",
    "StepPlan",
    "TorchLockstep",
    "room_for",
    "tensor_parallel_lockstep",
]
