"""Small, separately testable guards and handoff primitives."""

from colo_fsm.guards.barrier import Barrier, SoloBarrier, ThreadBarrier, TorchBarrier
from colo_fsm.guards.capacity import RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY, InFlightCap
from colo_fsm.guards.decision import (
    CheckpointDecision,
    LatchedDecision,
    MustSaveBy,
    ValidationDecision,
    broadcast_from_rank0,
)
from colo_fsm.guards.drain import DeviceDrain, NoDeviceDrain, default_drain, local_rank_from_env
from colo_fsm.guards.engine_state import EngineStateReport, check_engine_state, engine_state_of
from colo_fsm.guards.fingerprint import HandoffFingerprint
from colo_fsm.guards.memory import MemoryBudget, MemoryEstimate, TrainingShape, check_budget
from colo_fsm.guards.mode import ModelMode, ModeReport, check_training_mode
from colo_fsm.guards.parallelism import ParallelismCheck, ParallelismWarning, check_parallelism
from colo_fsm.guards.sampling import SamplingStream

__all__ = [
    "RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY",
    "Barrier",
    "CheckpointDecision",
    "DeviceDrain",
    "EngineStateReport",
    "HandoffFingerprint",
    "InFlightCap",
    "LatchedDecision",
    "MemoryBudget",
    "MemoryEstimate",
    "ModeReport",
    "ModelMode",
    "MustSaveBy",
    "NoDeviceDrain",
    "ParallelismCheck",
    "ParallelismWarning",
    "SamplingStream",
    "SoloBarrier",
    "ThreadBarrier",
    "TorchBarrier",
    "TrainingShape",
    "ValidationDecision",
    "broadcast_from_rank0",
    "check_budget",
    "check_engine_state",
    "check_parallelism",
    "check_training_mode",
    "default_drain",
    "engine_state_of",
    "local_rank_from_env",
]
