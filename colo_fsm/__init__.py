"""colo-fsm: an explicit, declarative state machine for a colocated inference engine and trainer.

The lifecycle is declared once (:data:`LIFECYCLE`); the runtime machine (:class:`Lifecycle`), the diagram,
the docs table and the model checker all read that declaration.

This namespace is the core, importable with ``transitions`` alone: the machine, the spec and its rules, the
guards, the errors, the adapter protocols, the replay buffer and collector, metrics as JSON lines. The heavier
parts are imported from their subpackages, each behind an extra: :mod:`colo_fsm.adapters.megatron`
(``[megatron]``), :mod:`colo_fsm.ray` (``[ray]``), :mod:`colo_fsm.server` (``[server]``),
:mod:`colo_fsm.timeline` (``[viz]``), :mod:`colo_fsm.testing` (``[testing]``), :mod:`colo_fsm.diagram` (Mermaid,
DOT, Markdown tables, and an SVG picture of the lifecycle drawn without Graphviz).
"""

from importlib.metadata import PackageNotFoundError, version

from colo_fsm import errors
from colo_fsm.adapters.protocols import Collector, Completion, GenerationEngine, StepResult, TextGenerator, Trainer
from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TextRollout, TrajectoryGroup
from colo_fsm.errors import (
    ActionFailed,
    BarrierTimeout,
    ColoFsmError,
    ConfigError,
    DrainError,
    EngineRebuild,
    EngineStateMismatch,
    GuardRejected,
    InvalidTransition,
    LifecycleError,
    ParallelismMismatch,
    RolloutDeferred,
    RolloutFailed,
    ServerUnavailable,
    UnsupportedEngine,
    WaitTimeout,
)
from colo_fsm.guards import (
    Barrier,
    CheckpointDecision,
    DeviceDrain,
    EngineStateReport,
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
    local_rank_from_env,
)
from colo_fsm.guards.handoff import HandoffLedger
from colo_fsm.log import get_logger
from colo_fsm.machine import AsyncLifecycle, Lifecycle, LifecycleConfig, LifecycleStatus, Trace, TraceRecord, read_trace
from colo_fsm.metrics import MetricsLogger, read_metrics
from colo_fsm.states import (
    LIFECYCLE,
    ActionSpec,
    Collective,
    CollectorCondition,
    EngineCondition,
    Fact,
    LifecycleSpec,
    State,
    StateSpec,
    TransitionSpec,
)
from colo_fsm.states.rules import RULES, LifecycleRule
from colo_fsm.states.validate import SpecError, validate_spec

try:
    __version__ = version("colo-fsm")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

__all__ = [
    "LIFECYCLE",
    "RULES",
    "ActionFailed",
    "ActionSpec",
    "AsyncCollector",
    "AsyncLifecycle",
    "Barrier",
    "BarrierTimeout",
    "CheckpointDecision",
    "Collective",
    "Collector",
    "CollectorCondition",
    "ColoFsmError",
    "Completion",
    "ConfigError",
    "DeviceDrain",
    "DrainError",
    "EngineCondition",
    "EngineRebuild",
    "EngineStateMismatch",
    "EngineStateReport",
    "Fact",
    "GenerationEngine",
    "GuardRejected",
    "HandoffLedger",
    "InFlightCap",
    "InvalidTransition",
    "LatchedDecision",
    "Lifecycle",
    "LifecycleConfig",
    "LifecycleError",
    "LifecycleRule",
    "LifecycleSpec",
    "LifecycleStatus",
    "MetricsLogger",
    "MustSaveBy",
    "ParallelismMismatch",
    "ParallelismWarning",
    "Prompt",
    "ReplayBuffer",
    "RolloutDeferred",
    "RolloutFailed",
    "ServerUnavailable",
    "SoloBarrier",
    "SpecError",
    "State",
    "StateSpec",
    "StepResult",
    "TextGenerator",
    "TextRollout",
    "ThreadBarrier",
    "TorchBarrier",
    "Trace",
    "TraceRecord",
    "Trainer",
    "TrajectoryGroup",
    "TransitionSpec",
    "UnsupportedEngine",
    "ValidationDecision",
    "WaitTimeout",
    "__version__",
    "broadcast_from_rank0",
    "check_parallelism",
    "errors",
    "get_logger",
    "local_rank_from_env",
    "read_metrics",
    "read_trace",
    "validate_spec",
]
