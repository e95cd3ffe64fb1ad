"""colo-fsm: an explicit, declarative state machine for a colocated inference engine and trainer.

The lifecycle is declared once (:data:`LIFECYCLE`); the runtime machine (:class:`Lifecycle`), the diagram,
the docs table and the model checker all read that declaration.
"""

from colo_fsm import errors
from colo_fsm.adapters.protocols import Collector, GenerationEngine, StepResult, Trainer
from colo_fsm.guards import (
    Barrier,
    CheckpointDecision,
    DeviceDrain,
    InFlightCap,
    LatchedDecision,
    MustSaveBy,
    ParallelismWarning,
    SoloBarrier,
    ThreadBarrier,
    TorchBarrier,
    ValidationDecision,
    broadcast_from_rank0,
    check_parallelism,
)
from colo_fsm.guards.handoff import HandoffLedger
from colo_fsm.machine import AsyncLifecycle, Lifecycle, LifecycleConfig, LifecycleStatus, Trace, TraceRecord, read_trace
from colo_fsm.states import LIFECYCLE, Collective, Fact, LifecycleSpec, State, TransitionSpec
from colo_fsm.states.validate import SpecError, validate_spec

__version__ = "0.1.0"

__all__ = [
    "LIFECYCLE",
    "AsyncLifecycle",
    "Barrier",
    "CheckpointDecision",
    "Collective",
    "Collector",
    "DeviceDrain",
    "Fact",
    "GenerationEngine",
    "HandoffLedger",
    "InFlightCap",
    "LatchedDecision",
    "Lifecycle",
    "LifecycleConfig",
    "LifecycleSpec",
    "LifecycleStatus",
    "MustSaveBy",
    "ParallelismWarning",
    "SoloBarrier",
    "SpecError",
    "State",
    "StepResult",
    "ThreadBarrier",
    "TorchBarrier",
    "Trace",
    "TraceRecord",
    "Trainer",
    "TransitionSpec",
    "ValidationDecision",
    "__version__",
    "broadcast_from_rank0",
    "check_parallelism",
    "errors",
    "read_trace",
    "validate_spec",
]
