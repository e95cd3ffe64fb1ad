"""megatron-core's ``InferenceConfig`` as both engine paths build it, and which decode batches it captures as CUDA
graphs (``cuda_graph_sizing``).

``num_cuda_graphs`` is an upper bound, not a count: with megatron-core 0.19.2's default ("exponential") sizing,
16 graphs asked for at 256 requests capture decode-only graphs for the 9 powers of two from 1 to 256, and a decode
step is padded to the smallest graph that holds it, so 65 requests run the 128 graph. "linear" sizing spaces them
evenly instead (every 16 requests at 256 requests and 16 graphs: a decode step is padded by at most 15 requests,
though 1 to 8 requests now run the 16 graph), and it sizes the mixed (prefill) graphs differently too: 48 graphs in
all against the default's 62 there. colo-fsm passes the choice to megatron's
``InferenceConfig.cuda_graph_sizing_distribution``; None leaves megatron's default.
"""

from __future__ import annotations

from typing import Any

from colo_fsm.errors import ConfigError

GRAPH_SIZINGS = ("exponential", "linear")
"""megatron-core's ``CudaGraphSizingDistribution`` values."""


def check_graph_sizing(value: Any, num_cuda_graphs: int | None) -> str | None:
    """``value`` as one of :data:`GRAPH_SIZINGS` (or None: megatron's default); raises :class:`ConfigError`
    naming ``cuda_graph_sizing`` for anything else, and when it is set without ``num_cuda_graphs`` (no graph is
    captured then, so the choice would be silently ignored)."""
    if value is None:
        return None
    if not isinstance(value, str) or value.strip().lower() not in GRAPH_SIZINGS:
        raise ConfigError("cuda_graph_sizing", value, f"one of {GRAPH_SIZINGS}, or None (megatron-core's default)")
    if num_cuda_graphs is None:
        raise ConfigError(
            "cuda_graph_sizing",
            value,
            "None while num_cuda_graphs is None (no CUDA graph is captured, so there is nothing to size)",
        )
    return value.strip().lower()


def megatron_inference_config(
    *,
    block_size_tokens: int,
    buffer_size_gb: float,
    max_requests: int,
    max_sequence_length: int,
    kv_cache_mode: str,
    num_cuda_graphs: int | None,
    cuda_graph_sizing: str | None,
    logprobs_mode: str,
    graphs_for_mixed_steps: bool = True,
    ep_consensus_interval: int | None = None,
) -> Any:
    """megatron-core's ``InferenceConfig`` from colo-fsm's settings (already checked by the engine's config): only
    the last token's logits materialized (every request asks log-probs of its generated tokens only), megatron's
    ``raw_logprobs``/``processed_logprobs`` for ``logprobs_mode``, and ``cuda_graph_sizing`` passed only when set,
    so megatron's default stays its own. ``graphs_for_mixed_steps=False`` captures graphs for decode-only steps
    alone (megatron's ``use_cuda_graphs_for_non_decode_steps``; the benchmarks' graph baseline asks it).
    ``ep_consensus_interval`` is megatron's, passed only when set (the coordinator path sets it: only megatron's
    coordinator loop reads it)."""
    from megatron.core.inference.config import CudaGraphSizingDistribution, InferenceConfig, KVCacheManagementMode

    sizing: dict[str, Any] = {}
    if cuda_graph_sizing is not None:
        sizing["cuda_graph_sizing_distribution"] = CudaGraphSizingDistribution(cuda_graph_sizing)
    if not graphs_for_mixed_steps:
        sizing["use_cuda_graphs_for_non_decode_steps"] = False
    if ep_consensus_interval is not None:
        sizing["ep_consensus_interval"] = ep_consensus_interval
    return InferenceConfig(
        block_size_tokens=block_size_tokens,
        buffer_size_gb=buffer_size_gb,  # megatron multiplies it by 1024**3
        max_requests=max_requests,
        max_sequence_length=max_sequence_length,
        kv_cache_management_mode=KVCacheManagementMode(kv_cache_mode),
        materialize_only_last_token_logits=True,
        num_cuda_graphs=num_cuda_graphs,
        logprobs_mode="processed_logprobs" if logprobs_mode == "processed" else "raw_logprobs",
        **sizing,
    )


__all__ = ["GRAPH_SIZINGS", "check_graph_sizing", "megatron_inference_config"]
