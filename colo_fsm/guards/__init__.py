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
from colo_fsm.guards.parallelism import ParallelismCheck, ParallelismWarning, check_parallelism

__all__ = [
    "RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY",
    "Barrier",
    "CheckpointDecision",
    "DeviceDrain",
    "InFlightCap",
    "LatchedDecision",
    "MustSaveBy",
    "NoDeviceDrain",
    "ParallelismCheck",
    "ParallelismWarning",
    "SoloBarrier",
    "ThreadBarrier",
    "TorchBarrier",
    "ValidationDecision",
    "broadcast_from_rank0",
    "check_parallelism",
    "default_drain",
    "local_rank_from_env",
]
