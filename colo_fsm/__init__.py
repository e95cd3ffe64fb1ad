"""colo-fsm: an explicit, declarative state machine for a colocated inference engine and trainer.

The lifecycle is declared once (:data:`LIFECYCLE`); the runtime machine (:class:`Lifecycle`), the diagram,
the docs table and the model checker all read that declaration.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from colo_fsm import errors
from colo_fsm.adapters.protocols import Collector, Completion, GenerationEngine, StepResult, TextGenerator, Trainer
from colo_fsm.errors import (
    ActionFailed,
    BarrierTimeout,
    ColoFsmError,
    ConfigError,
    DrainError,
    EngineRebuild,
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
from colo_fsm.machine import AsyncLifecycle, Lifecycle, LifecycleConfig, LifecycleStatus, Trace, TraceRecord, read_trace
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
from colo_fsm.states.validate import SpecError, validate_spec

__version__ = "0.1.0"

# Heavier parts (FastAPI, Ray, megatron-core, matplotlib, hypothesis) load on first use, so `import colo_fsm`
# stays cheap for a user who only embeds the machine.
_LAZY: dict[str, tuple[str, str]] = {
    "MetricsLogger": ("colo_fsm.metrics", "MetricsLogger"),
    "read_metrics": ("colo_fsm.metrics", "read_metrics"),
    "Prompt": ("colo_fsm.collector", "Prompt"),
    "TextRollout": ("colo_fsm.collector", "TextRollout"),
    "recording_adapters": ("colo_fsm.testing", "recording_adapters"),
    "get_logger": ("colo_fsm.log", "get_logger"),
    "ReplayBuffer": ("colo_fsm.collector", "ReplayBuffer"),
    "TrajectoryGroup": ("colo_fsm.collector", "TrajectoryGroup"),
    "AsyncCollector": ("colo_fsm.collector", "AsyncCollector"),
    "GatedEngine": ("colo_fsm.server", "GatedEngine"),
    "OpenAIServer": ("colo_fsm.server", "OpenAIServer"),
    "SuspendGate": ("colo_fsm.server", "SuspendGate"),
    "RayEngineProxy": ("colo_fsm.ray", "RayEngineProxy"),
    "RayCollectorProxy": ("colo_fsm.ray", "RayCollectorProxy"),
    "RayDrain": ("colo_fsm.ray", "RayDrain"),
    "init_ray": ("colo_fsm.ray", "init_ray"),
    "RayTrainerProxy": ("colo_fsm.ray", "RayTrainerProxy"),
    "ColocatedFactory": ("colo_fsm.ray", "ColocatedFactory"),
    "WorkerAdapters": ("colo_fsm.ray", "WorkerAdapters"),
    "MegatronEngine": ("colo_fsm.adapters.megatron", "MegatronEngine"),
    "MegatronTrainer": ("colo_fsm.adapters.megatron", "MegatronTrainer"),
    "ModelConfig": ("colo_fsm.adapters.megatron", "ModelConfig"),
    "GenerationConfig": ("colo_fsm.adapters.megatron", "GenerationConfig"),
    "TrainerConfig": ("colo_fsm.adapters.megatron", "TrainerConfig"),
    "KVCacheMode": ("colo_fsm.adapters.megatron", "KVCacheMode"),
    "to_mermaid": ("colo_fsm.diagram", "to_mermaid"),
    "to_dot": ("colo_fsm.diagram", "to_dot"),
    "render_diagram": ("colo_fsm.diagram", "render"),
    "render_timeline": ("colo_fsm.timeline", "render_timeline"),
    "LifecycleMachine": ("colo_fsm.testing", "LifecycleMachine"),
    "lifecycle_test_case": ("colo_fsm.testing", "lifecycle_test_case"),
    "check_handoff": ("colo_fsm.testing", "check"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'colo_fsm' has no attribute {name!r}") from None
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from colo_fsm.adapters.megatron import (
        GenerationConfig,
        KVCacheMode,
        MegatronEngine,
        MegatronTrainer,
        ModelConfig,
        TrainerConfig,
    )
    from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TextRollout, TrajectoryGroup
    from colo_fsm.diagram import render as render_diagram
    from colo_fsm.diagram import to_dot, to_mermaid
    from colo_fsm.log import get_logger
    from colo_fsm.metrics import MetricsLogger, read_metrics
    from colo_fsm.ray import (
        ColocatedFactory,
        RayCollectorProxy,
        RayDrain,
        RayEngineProxy,
        RayTrainerProxy,
        WorkerAdapters,
        init_ray,
    )
    from colo_fsm.server import GatedEngine, OpenAIServer, SuspendGate
    from colo_fsm.testing import LifecycleMachine, lifecycle_test_case, recording_adapters
    from colo_fsm.testing import check as check_handoff
    from colo_fsm.timeline import render_timeline

__all__ = [
    "LIFECYCLE",
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
    "ColocatedFactory",
    "Completion",
    "ConfigError",
    "DeviceDrain",
    "DrainError",
    "EngineCondition",
    "EngineRebuild",
    "Fact",
    "GatedEngine",
    "GenerationConfig",
    "GenerationEngine",
    "GuardRejected",
    "HandoffLedger",
    "InFlightCap",
    "InvalidTransition",
    "KVCacheMode",
    "LatchedDecision",
    "Lifecycle",
    "LifecycleConfig",
    "LifecycleError",
    "LifecycleMachine",
    "LifecycleSpec",
    "LifecycleStatus",
    "MegatronEngine",
    "MegatronTrainer",
    "MetricsLogger",
    "ModelConfig",
    "MustSaveBy",
    "OpenAIServer",
    "ParallelismMismatch",
    "ParallelismWarning",
    "Prompt",
    "RayCollectorProxy",
    "RayDrain",
    "RayEngineProxy",
    "RayTrainerProxy",
    "ReplayBuffer",
    "RolloutDeferred",
    "RolloutFailed",
    "ServerUnavailable",
    "SoloBarrier",
    "SpecError",
    "State",
    "StateSpec",
    "StepResult",
    "SuspendGate",
    "TextGenerator",
    "TextRollout",
    "ThreadBarrier",
    "TorchBarrier",
    "Trace",
    "TraceRecord",
    "Trainer",
    "TrainerConfig",
    "TrajectoryGroup",
    "TransitionSpec",
    "UnsupportedEngine",
    "ValidationDecision",
    "WaitTimeout",
    "WorkerAdapters",
    "__version__",
    "broadcast_from_rank0",
    "check_handoff",
    "check_parallelism",
    "errors",
    "get_logger",
    "init_ray",
    "lifecycle_test_case",
    "local_rank_from_env",
    "read_metrics",
    "read_trace",
    "recording_adapters",
    "render_diagram",
    "render_timeline",
    "to_dot",
    "to_mermaid",
    "validate_spec",
]
