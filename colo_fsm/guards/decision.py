"""Decide once per step, reuse everywhere: latched checkpoint and validation decisions.

A decision is evaluated at most once per step; every later query for the same step returns the cached
answer. The time rule ("must save by") fires once and then stays quiet, so asking it twice would report a
save at one site and skip it at the other; the latch makes the second site read the first answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from colo_fsm.errors import ConfigError
from colo_fsm.guards.barrier import wait_for
from colo_fsm.guards.drain import local_rank_from_env


def _positive_int_or_none(field: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(field, value, "a positive integer or None")
    return value


class MustSaveBy:
    """A one-shot time rule: True the first time it is asked at or after ``deadline_s``, False ever after.

    ``deadline_s`` counts seconds from construction on ``clock`` (``time.monotonic`` by default).
    """

    def __init__(self, deadline_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float) or not 0 <= deadline_s < math.inf:
            raise ConfigError("must_save_by_s", deadline_s, "a finite non-negative number of seconds")
        if not callable(clock):
            raise ConfigError("clock", clock, "a callable returning seconds")
        self._clock = clock
        self._deadline = clock() + float(deadline_s)
        self.fired = False

    def __call__(self) -> bool:
        if self.fired or self._clock() < self._deadline:
            return False
        self.fired = True
        return True


class LatchedDecision:
    """Evaluate ``rule(step)`` once per step and return the same answer to every later query of that step.

    ``agree`` (optional) turns this rank's answer into the world's answer (for example rank 0's, broadcast
    with :func:`broadcast_from_rank0`), so a clock that differs across ranks cannot split the world.
    Steps must be queried in non-decreasing order; asking about an earlier step raises.
    """

    def __init__(self, name: str, rule: Callable[[int], bool], *, agree: Callable[[bool], bool] | None = None) -> None:
        if not callable(rule):
            raise ConfigError(f"{name}.rule", rule, "a callable step -> bool")
        if agree is not None and not callable(agree):
            raise ConfigError(f"{name}.agree", agree, "None or a callable bool -> bool")
        self.name = name
        self._rule = rule
        self._agree = agree
        self._step: int | None = None
        self._answer = False
        self.evaluations = 0  # how often the rule itself ran (once per step when latched)

    def decide(self, step: int) -> bool:
        """The decision for ``step``: evaluated on the first query of the step, cached after."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError("step", step, "a non-negative integer")
        if self._step is not None and step < self._step:
            raise ConfigError("step", step, f"a step >= {self._step} (decisions are latched in order)")
        if step != self._step:
            answer = bool(self._rule(step))
            self.evaluations += 1
            self._answer = self._agree(answer) if self._agree else answer
            self._step = step
        return self._answer

    def peek(self, step: int) -> bool | None:
        """The latched answer for ``step`` if it was decided already, else None (never evaluates)."""
        return self._answer if step == self._step else None

    @property
    def agrees(self) -> bool:
        """Whether this decision turns a rank's answer into the world's (it has an ``agree`` function)."""
        return self._agree is not None

    def agree_with(self, agree: Callable[[bool], bool]) -> None:
        """Give a decision built without one its ``agree`` function (before its first query), e.g. the one a
        test harness of thread ranks supplies; a decision that has one keeps it."""
        if not callable(agree):
            raise ConfigError(f"{self.name}.agree", agree, "a callable bool -> bool")
        if self._step is not None:
            raise ConfigError(f"{self.name}.agree", agree, "set before the decision's first query")
        if self._agree is None:
            self._agree = agree


class CheckpointDecision(LatchedDecision):
    """Whether a step saves a checkpoint: every ``every_steps`` steps, on the run's last step
    (``save_on_last_step``, as NeMo-RL saves at ``is_last_step``; the lifecycle tells the decision the run's
    ``num_steps``), and/or once the ``must_save_by_s`` deadline has passed, and/or when your own ``save_and_stop``
    time rule says so (a zero-argument callable, e.g. a job-timeout checker; asked once per step, inside the
    latch). When a time rule fires, that step also becomes the run's last (``deadline_stop``), as a job about to
    lose its allocation expects."""

    def __init__(
        self,
        every_steps: int | None = None,
        *,
        must_save_by_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        agree: Callable[[bool], bool] | None = None,
        deadline_stop: bool = True,
        save_and_stop: Callable[[], bool] | None = None,
        save_on_last_step: bool = False,
    ) -> None:
        self.every_steps = _positive_int_or_none("CheckpointDecision.every_steps", every_steps)
        if not isinstance(save_on_last_step, bool):
            raise ConfigError("save_on_last_step", save_on_last_step, "True or False")
        self.save_on_last_step = save_on_last_step
        self.num_steps: int | None = None  # the run's length, told by the lifecycle (bind_num_steps)
        self.must_save_by = MustSaveBy(must_save_by_s, clock=clock) if must_save_by_s is not None else None
        if save_and_stop is not None and not callable(save_and_stop):
            raise ConfigError("save_and_stop", save_and_stop, "None or a callable () -> bool (a time rule)")
        self.save_and_stop = save_and_stop
        if not isinstance(deadline_stop, bool):
            raise ConfigError("deadline_stop", deadline_stop, "True or False")
        self.deadline_stop = deadline_stop
        self.deadline_step: int | None = None
        super().__init__("checkpoint", self._rule, agree=agree)

    def bind_num_steps(self, num_steps: int | None) -> None:
        """The run's ``num_steps`` (``LifecycleConfig.num_steps``; the lifecycle calls this at construction): the
        step with index ``num_steps - 1`` is the last, which ``save_on_last_step`` saves."""
        self.num_steps = num_steps

    def _rule(self, step: int) -> bool:
        periodic = self.every_steps is not None and (step + 1) % self.every_steps == 0
        if self.save_on_last_step and self.num_steps is not None and step + 1 >= self.num_steps:
            periodic = True
        deadline = False
        if self.must_save_by is not None or self.save_and_stop is not None:
            deadline = bool(self.must_save_by()) if self.must_save_by is not None else False
            if self.save_and_stop is not None:
                deadline = bool(self.save_and_stop()) or deadline
            if self._agree is not None:
                # The deadline also decides whether this step is the run's last: it must be the world's answer,
                # not this rank's clock (every rank makes this call once per step, in the same order).
                deadline = self._agree(deadline)
        if deadline:
            self.deadline_step = step
        return periodic or deadline

    @property
    def needs_agreement(self) -> bool:
        """True when the decision reads a clock, so ranks must agree on it (pass ``agree``)."""
        return bool(self.time_rules)

    @property
    def time_rules(self) -> tuple[str, ...]:
        """The time rules set, by the argument that set them (``must_save_by_s``, ``save_and_stop``)."""
        rules = (("must_save_by_s", self.must_save_by), ("save_and_stop", self.save_and_stop))
        return tuple(name for name, rule in rules if rule is not None)

    def stops_run(self, step: int) -> bool:
        """Whether the deadline rule fired at ``step`` and the run should end after its save."""
        return self.deadline_stop and self.deadline_step == step


class ValidationDecision(LatchedDecision):
    """Whether a step validates: every ``every_steps`` steps (never when None)."""

    def __init__(self, every_steps: int | None = None, *, agree: Callable[[bool], bool] | None = None) -> None:
        self.every_steps = _positive_int_or_none("ValidationDecision.every_steps", every_steps)
        super().__init__(
            "validation",
            lambda step: self.every_steps is not None and (step + 1) % self.every_steps == 0,
            agree=agree,
        )


def broadcast_from_rank0(group: Any = None) -> Callable[[bool], bool]:
    """An ``agree`` function for SPMD runs: every rank adopts rank 0's decision (a torch broadcast)."""

    held: list[Any] = []  # the last broadcast's work handle (see wait_for)

    def agree(value: bool) -> bool:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return value
        src = dist.get_global_rank(group, 0) if group is not None else 0
        # the rank's own GPU, by LOCAL_RANK: the calling thread may never have called set_device
        device = torch.device("cuda", local_rank_from_env()) if dist.get_backend(group) == "nccl" else "cpu"
        t = torch.tensor([1 if value else 0], dtype=torch.int32, device=device)
        held[:] = [wait_for(dist.broadcast(t, src=src, group=group, async_op=True))]
        return bool(t.item())

    return agree


__all__ = [
    "CheckpointDecision",
    "LatchedDecision",
    "MustSaveBy",
    "ValidationDecision",
    "broadcast_from_rank0",
]
