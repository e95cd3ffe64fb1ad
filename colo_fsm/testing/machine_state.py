"""What one program of the lifecycle machine holds once ``setup`` ran: the attributes its oracle, its invariants and
its rules share (declared here once, so each of those modules reads them typed)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, ClassVar

from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.guards.decision import LatchedDecision
from colo_fsm.machine.aio import AsyncLifecycle
from colo_fsm.machine.lifecycle import Lifecycle
from colo_fsm.states.spec import LifecycleSpec
from colo_fsm.testing.components import AdapterFactory, Adapters, KitHandle
from colo_fsm.testing.effects import Effects
from colo_fsm.testing.fakes import FakeClock, FakeReplayBuffer, FakeRequestSource
from colo_fsm.testing.programs import RunConfig, StepRecord
from colo_fsm.testing.watch import (
    Conditions,
    EventLog,
    FaultSwitch,
    HandoffAudit,
    LoopRunner,
    WatchedCollector,
    WatchedEngine,
    WatchedTrainer,
)


class MachineState:
    """The class settings of a :class:`~colo_fsm.testing.lifecycle_machine.LifecycleMachine` and the attributes of
    one of its programs (set by its ``setup``)."""

    # class settings (see LifecycleMachine)
    adapters_factory: ClassVar[AdapterFactory]
    spec: ClassVar[LifecycleSpec]
    check_spec: ClassVar[bool]
    lifecycle_class: ClassVar[type[Lifecycle]]
    drain_class: ClassVar[Callable[..., Callable[[], object]]]
    checkpoint_class: ClassVar[Callable[..., LatchedDecision]]
    cap_class: ClassVar[Callable[..., InFlightCap]]
    local_rank: ClassVar[int]
    inject_faults: ClassVar[bool]
    first_fault: ClassVar[tuple[str, str] | None]
    fixed_options: ClassVar[dict[str, Any]]
    use_async_lifecycle: ClassVar[bool]
    async_training: ClassVar[bool]
    batch_factory: ClassVar[Callable[[list[int], int], Any] | None]

    # one program
    runner: LoopRunner
    lc: Lifecycle | None
    alc: AsyncLifecycle | None
    ad: Adapters | None
    violations: collections.defaultdict[str, list[str]]
    cfg: RunConfig
    handle: KitHandle
    conditions: Conditions
    log: EventLog
    faults: FaultSwitch
    engine: WatchedEngine
    trainer: WatchedTrainer
    collector: WatchedCollector | None
    clock: FakeClock
    deadline_at: float | None
    deadline_fired: bool
    user_decisions: dict[str, bool]
    user_validator: Callable[[int, int], Any] | None
    server: FakeRequestSource
    buffer: FakeReplayBuffer
    cap: InFlightCap
    in_flight: list[int]
    audit: HandoffAudit
    steps: list[StepRecord]
    scan_pos: int
    trace_pos: int
    builds: int
    adopts: bool
    last_latched_at: int | None
    validations: int
    fault_waited: int
    effects: Effects

    def _probe(self) -> tuple[str | None, str | None]:
        """What your adapters report of their conditions (engine, collector), when they report it."""
        raise NotImplementedError

    def _state_name(self) -> str:
        """The lifecycle's state now (its initial one before it is built)."""
        raise NotImplementedError


__all__ = ["MachineState"]
