"""Continuous batching per rank: one engine thread steps every active request together (engine-agnostic).

Requests from rollouts, the server and validation are submitted one by one (:meth:`ContinuousBatcher.submit`)
and admitted between decode steps, training first (:class:`Priority`), at most ``max_active_requests`` at a
time; each caller waits on its own future. There is no global generate lock: a request never waits for another
caller's batch to finish.

A handoff stops *decode steps*, not requests (:attr:`~colo_fsm.states.rules.LifecycleRule.PARK_NOT_DRAIN`):
:meth:`ContinuousBatcher.suspend` returns once the step in flight has finished and the backend is suspended;
the active requests stay parked in the backend and continue after :meth:`ContinuousBatcher.resume` under the new
weights. Every generated token is stamped with the weight version it was produced under.
:attr:`InflightPolicy.DRAIN` restores the strictly on-policy behaviour (suspend waits for admitted requests).

Cancellation (:meth:`ContinuousBatcher.abort`, ``handle.cancel()``, a cancelled future or awaiting task) is safe
in every state: it answers the caller at once and removes the request from the backend at the next step
boundary while awake; while suspended the removal waits for the resume (applied before the first decode step).
No decode step ever runs on a suspended backend.

Every backend call (build, add, step, abort, suspend, resume, shutdown) runs on the engine thread, so a
backend needs no locking of its own and an engine with its own event loop (megatron-core's dynamic engine) is
only ever driven from one thread.

Modules, one job each: :mod:`~colo_fsm.adapters.engine.protocol` (the backend protocol),
:mod:`~colo_fsm.adapters.engine.options` (priorities, in-flight policy, request checks),
:mod:`~colo_fsm.adapters.engine.results` (completions, handles, counts),
:mod:`~colo_fsm.adapters.engine.admission`, :mod:`~colo_fsm.adapters.engine.stepping`,
:mod:`~colo_fsm.adapters.engine.cancellation`, :mod:`~colo_fsm.adapters.engine.suspension`,
:mod:`~colo_fsm.adapters.engine.lockstep_loop` and :mod:`~colo_fsm.adapters.engine.loop` (the thread).
"""

from colo_fsm.adapters.engine.loop import ContinuousBatcher
from colo_fsm.adapters.engine.options import (
    DEFAULT_MAX_TOP_LOGPROBS,
    DEFAULT_SERVER_SHARE,
    InflightPolicy,
    LogprobsMode,
    Priority,
    check_sampling,
    check_share,
    check_top_logprobs,
    parse_inflight,
    parse_logprobs_mode,
    request_seed,
)
from colo_fsm.adapters.engine.protocol import BackendRequest, StepBackend, StepOutput, TopLogprobs
from colo_fsm.adapters.engine.results import InflightStats, OnToken, RequestCounts, RequestHandle, TokenCompletion

__all__ = [
    "DEFAULT_MAX_TOP_LOGPROBS",
    "DEFAULT_SERVER_SHARE",
    "BackendRequest",
    "ContinuousBatcher",
    "InflightPolicy",
    "InflightStats",
    "LogprobsMode",
    "OnToken",
    "Priority",
    "RequestCounts",
    "RequestHandle",
    "StepBackend",
    "StepOutput",
    "TokenCompletion",
    "TopLogprobs",
    "check_sampling",
    "check_share",
    "check_top_logprobs",
    "parse_inflight",
    "parse_logprobs_mode",
    "request_seed",
]
