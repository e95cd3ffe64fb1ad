"""Continuous batching per rank: the engine loop, re-exported from :mod:`colo_fsm.adapters.engine`.

This module keeps the historical import path (``from colo_fsm.adapters.batching import ContinuousBatcher``);
the code lives in the :mod:`colo_fsm.adapters.engine` package, one module per job.
"""

from colo_fsm.adapters.engine import (
    DEFAULT_MAX_TOP_LOGPROBS,
    DEFAULT_SERVER_SHARE,
    BackendRequest,
    ContinuousBatcher,
    InflightPolicy,
    InflightStats,
    LogprobsMode,
    OnToken,
    Priority,
    RequestCounts,
    RequestHandle,
    StepBackend,
    StepOutput,
    TokenCompletion,
    TopLogprobs,
    check_sampling,
    check_share,
    check_top_logprobs,
    parse_inflight,
    parse_logprobs_mode,
    request_seed,
)

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
