"""The runtime machine built from the declared lifecycle."""

from colo_fsm.machine.aio import AsyncLifecycle
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig, LifecycleStatus
from colo_fsm.machine.trace import Trace, TraceRecord, read_trace

__all__ = ["AsyncLifecycle", "Lifecycle", "LifecycleConfig", "LifecycleStatus", "Trace", "TraceRecord", "read_trace"]
