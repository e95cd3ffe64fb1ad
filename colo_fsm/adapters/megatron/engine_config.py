"""Settings of the colocated engine: :class:`GenerationConfig` (validated at construction) and the KV-cache modes.

Used by :mod:`colo_fsm.adapters.megatron.engine` (which re-exports both) and by the coordinator's settings
(:mod:`colo_fsm.adapters.megatron.coordinator_config`), which share the KV-cache modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from colo_fsm.adapters.batching import (
    DEFAULT_MAX_TOP_LOGPROBS,
    DEFAULT_SERVER_SHARE,
    check_share,
    parse_inflight,
    parse_logprobs_mode,
)
from colo_fsm.adapters.megatron.inference_settings import check_graph_sizing
from colo_fsm.errors import ConfigError


class KVCacheMode(StrEnum):
    """What suspend does to the KV cache (megatron-core's ``KVCacheManagementMode``)."""

    PERSIST = "persist"  # keep it on the GPU, same addresses: CUDA graphs stay valid
    OFFLOAD = "offload"  # copy to host on suspend, back on resume: graphs recaptured
    RECOMPUTE = "recompute"  # free on suspend, re-prefill on resume: graphs recaptured


def parse_kv_cache_mode(value: Any) -> KVCacheMode:
    """``value`` as a :class:`KVCacheMode`; anything else raises :class:`ConfigError` naming the choices."""
    try:
        return KVCacheMode(str(value.value if isinstance(value, StrEnum) else value).lower())
    except ValueError:
        raise ConfigError("kv_cache_mode", value, "one of 'persist', 'offload', 'recompute'") from None


_BACKENDS = ("auto", "dynamic", "cpu")


@dataclass(frozen=True)
class GenerationConfig:
    """Settings of the colocated engine.

    Parallel sizes left at None inherit the training model's; set ones must match it (TP/PP/EP/ETP raise
    :class:`~colo_fsm.errors.ParallelismMismatch`, CP warns) because a colocated engine cannot reshard.
    ``inflight`` is what a suspend does with admitted requests ("park", alias "keep": kept, continued after the
    resume; "drain", alias "wait": waited for; "abort": ended, then resubmitted as prompt + tokens so far and
    re-prefilled after the resume); ``max_active_requests`` bounds the requests decoded together;
    ``max_requests`` (None: ``max_active_requests``) is megatron-core's own bound on the requests its dynamic
    engine holds (``InferenceConfig.max_requests``, which also sizes its CUDA-graph batches), at least
    ``max_active_requests``;
    ``max_request_tokens`` (None: no bound) bounds prompts x max_tokens of one ``generate``/``generate_ids``
    call; ``num_cuda_graphs`` is passed to megatron-core's ``InferenceConfig.num_cuda_graphs`` (the batch shapes
    the dynamic engine pre-captures when the model was built with ``cuda_graph_impl="local"``; an upper bound),
    ``cuda_graph_sizing`` to its ``cuda_graph_sizing_distribution`` ("exponential", megatron's default: powers of
    two; "linear": evenly spaced, a decode step padded by at most the spacing; None: megatron's default; see
    :mod:`~colo_fsm.adapters.megatron.inference_settings`);
    ``tp_lockstep`` (TP > 1) has the TP group's leader plan every decode step for the whole group
    (:mod:`colo_fsm.adapters.lockstep`): off, TP peers drift by a step and the next handoff desyncs;
    ``max_top_logprobs`` bounds the per-token alternatives one request may ask for (``submit(top_logprobs=k)``);
    ``server_share`` (in (0, 1], default 0.5) bounds the share of ``max_active_requests`` that
    ``Priority.SERVER`` requests (HTTP traffic) hold at once, so the trainer's rollouts always keep the rest
    (server work beyond it waits queued; 1 lifts the cap); ``logprobs_mode`` is the distribution every returned
    log-prob comes from: "raw" (default, vLLM's default: the model's untempered softmax) or "processed" (after
    temperature, top-k and top-p: the distribution each token was sampled from, what an importance ratio against
    a trainer computing log-probs at the sampling temperature needs). On the CPU path a request may ask for
    either (``submit(logprobs_mode=...)``); megatron-core's dynamic engine has one mode for all its requests.
    ``sampling_seed`` is the base seed of the engine's sampling stream, mixed with ``data_parallel_rank`` (None:
    megatron-core's data-parallel rank) so every data-parallel replica samples from a stream of its own
    (:mod:`colo_fsm.guards.sampling`; two replicas on one stream are refused at the first handoff barrier).
    """

    kv_cache_mode: str = "persist"
    backend: str = "auto"
    buffer_size_gb: float = 1.0
    max_requests: int | None = None
    block_size_tokens: int = 256
    tensor_model_parallel_size: int | None = None
    pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int | None = None
    expert_tensor_parallel_size: int | None = None
    context_parallel_size: int | None = None
    inflight: str = "park"
    max_active_requests: int = 64
    max_request_tokens: int | None = None
    num_cuda_graphs: int | None = None
    cuda_graph_sizing: str | None = None
    tp_lockstep: bool = True
    max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS
    server_share: float = DEFAULT_SERVER_SHARE
    logprobs_mode: str = "raw"
    sampling_seed: int = 0
    data_parallel_rank: int | None = None

    @property
    def engine_max_requests(self) -> int:
        """The requests megatron-core's dynamic engine holds at once: ``max_requests``, else
        ``max_active_requests`` (every request colo-fsm admits decodes in the same step)."""
        return self.max_requests if self.max_requests is not None else self.max_active_requests

    def __post_init__(self) -> None:
        if isinstance(self.sampling_seed, bool) or not isinstance(self.sampling_seed, int) or self.sampling_seed < 0:
            raise ConfigError("sampling_seed", self.sampling_seed, "a non-negative integer")
        d = self.data_parallel_rank
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0):
            raise ConfigError("data_parallel_rank", d, "a non-negative integer, or None (megatron-core's DP rank)")
        if not isinstance(self.tp_lockstep, bool):
            raise ConfigError("tp_lockstep", self.tp_lockstep, "True or False")
        object.__setattr__(self, "kv_cache_mode", parse_kv_cache_mode(self.kv_cache_mode).value)
        object.__setattr__(self, "inflight", parse_inflight(self.inflight).value)
        object.__setattr__(self, "server_share", check_share(self.server_share))
        object.__setattr__(self, "logprobs_mode", parse_logprobs_mode(self.logprobs_mode).value)
        for name, what in (
            ("max_active_requests", "a positive integer"),
            ("max_request_tokens", "a positive integer, or None (no bound)"),
            ("num_cuda_graphs", "a positive integer, or None (no pre-captured CUDA graphs)"),
        ):
            v = getattr(self, name)
            if (v is not None or name == "max_active_requests") and (
                isinstance(v, bool) or not isinstance(v, int) or v < 1
            ):
                raise ConfigError(name, v, what)
        object.__setattr__(self, "cuda_graph_sizing", check_graph_sizing(self.cuda_graph_sizing, self.num_cuda_graphs))
        if self.kv_cache_mode == "offload" and self.num_cuda_graphs is not None and self.inflight == "park":
            # megatron-core 0.19.2 recaptures the graphs at an offload resume: it adds dummy requests to the
            # context (RequestOverflowError with requests parked there, seen on one H200) and resets the
            # context after every capture, which would drop the parked requests' state.
            raise ConfigError(
                "kv_cache_mode",
                self.kv_cache_mode,
                "'persist' (graphs stay valid) or 'recompute' (parked requests are re-added after the recapture) "
                "with num_cuda_graphs and inflight='park'; or inflight='drain' for offload with graphs",
            )
        m = self.max_top_logprobs
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError("max_top_logprobs", m, "a non-negative integer (0: no alternatives)")
        if self.backend not in _BACKENDS:
            raise ConfigError("backend", self.backend, f"one of {_BACKENDS}")
        if (
            isinstance(self.buffer_size_gb, bool)
            or not isinstance(self.buffer_size_gb, int | float)
            or self.buffer_size_gb <= 0
        ):
            raise ConfigError("buffer_size_gb", self.buffer_size_gb, "a positive number of GiB")
        if (
            isinstance(self.block_size_tokens, bool)
            or not isinstance(self.block_size_tokens, int)
            or self.block_size_tokens < 1
        ):
            raise ConfigError("block_size_tokens", self.block_size_tokens, "a positive integer")
        if self.max_requests is not None and (
            isinstance(self.max_requests, bool) or not isinstance(self.max_requests, int) or self.max_requests < 1
        ):
            raise ConfigError("max_requests", self.max_requests, "a positive integer, or None (max_active_requests)")
        if self.max_requests is not None and self.max_requests < self.max_active_requests:
            raise ConfigError(
                "max_requests",
                self.max_requests,
                f"at least max_active_requests={self.max_active_requests} (colo-fsm admits that many requests into "
                "megatron-core's engine; with fewer slots there the rest would wait in megatron's own queue, out "
                "of reach of the engine's priority and turn order), or None",
            )
        for name in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "expert_model_parallel_size",
            "expert_tensor_parallel_size",
            "context_parallel_size",
        ):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(name, v, "a positive integer, or None (inherit the training model's)")
