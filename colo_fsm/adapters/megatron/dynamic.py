"""The GPU generation path: megatron-core's dynamic inference engine over the training model object.

``MegatronLLM(model=..., use_coordinator=False)`` builds the engine once (context, inference wrapper,
controller, ``DynamicInferenceEngine``); in this direct mode its own ``suspend()``/``resume()`` methods are
refused, so suspend and resume go to the underlying ``DynamicInferenceEngine``. That engine clears the
process-wide ``InferenceMode`` flag on ``suspend()`` and sets it again on ``resume()``.

KV-cache modes (``InferenceConfig.kv_cache_management_mode``) and CUDA graphs:

* ``persist``: the KV buffer stays on the GPU at the same address; suspend/resume cost about a millisecond
  and captured CUDA graphs stay valid (never recaptured).
* ``offload``: the KV buffer is copied to host memory on suspend and back on resume, freeing GPU memory for
  training; because the buffer comes back at a new address, the engine deletes its CUDA graphs on suspend
  and recaptures them on resume (unless ``static_kv_memory_pointers`` with UVM / torch_memory_saver).
* ``recompute``: the KV buffer is freed on suspend and reallocated empty on resume; in-flight requests are
  re-prefilled. CUDA graphs are deleted and recaptured as for ``offload``.

CUDA graphs are only captured when the model's ``TransformerConfig`` asks for them (``cuda_graph_impl=
"local"``); with the default config ``create_cuda_graphs()`` does nothing and the recapture costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from colo_fsm.adapters.megatron.cpu_loop import Generated
from colo_fsm.adapters.megatron.parallel import on_own_device
from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger

log = get_logger("colo_fsm.megatron")


def dynamic_engine_available() -> tuple[bool, str]:
    """Whether the dynamic engine can run here, and if not, why (no CUDA device, no flash-attention)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device (megatron-core's dynamic engine needs flash-attention on a GPU)"
    from megatron.core.transformer import attention as mattn  # megatron-core's own flash-attention probes

    for flag in ("HAVE_FA4", "HAVE_FA3"):
        if getattr(mattn, flag, False):
            return True, f"CUDA device and flash-attention ({flag}) found"
    if getattr(mattn, "flash_attn_with_kvcache", None) is not None:
        return True, "CUDA device and flash-attention 2 found"
    return False, "no flash-attention importable (the dynamic engine's paged attention needs it)"


def check_head_dim(config: Any) -> None:
    """Refuse a head dimension the dynamic engine's paged flash-attention cannot run (not a multiple of 16).

    flash-attn-4 on an H200 asserts "Paged KV does not support irregular head dim" for e.g. head dim 8.
    """
    kv = getattr(config, "kv_channels", None) or config.hidden_size // config.num_attention_heads
    if kv % 16:
        raise ConfigError(
            "kv_channels",
            kv,
            "a multiple of 16 for the dynamic engine's paged flash-attention (hidden_size / num_attention_heads)",
        )


class DynamicBackend:
    """Generation on ``DynamicInferenceEngine`` (built through ``MegatronLLM(use_coordinator=False)``)."""

    name = "dynamic"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        kv_cache_mode: str,
        max_sequence_length: int,
        buffer_size_gb: float,
        max_requests: int | None,
        block_size_tokens: int,
    ) -> None:
        from megatron.core.inference.apis.llm import MegatronLLM
        from megatron.core.inference.config import InferenceConfig, KVCacheManagementMode

        check_head_dim(model.config)
        self.device = next(model.parameters()).device  # entry points run with this rank's GPU current
        self.tokenizer = tokenizer
        self.inference_config = InferenceConfig(
            block_size_tokens=block_size_tokens,
            buffer_size_gb=buffer_size_gb,  # type: ignore[arg-type]  # megatron multiplies it by 1024**3
            max_requests=max_requests if max_requests is not None else 128,  # bounded: see InferenceConfig
            max_sequence_length=max_sequence_length,
            kv_cache_management_mode=KVCacheManagementMode(kv_cache_mode),
            materialize_only_last_token_logits=True,
        )
        model.eval()
        self.llm = MegatronLLM(
            model=model, tokenizer=tokenizer, inference_config=self.inference_config, use_coordinator=False
        )
        self.engine = self.llm.engine
        self.timings: list[tuple[str, float]] = []

    @on_own_device
    def generate(
        self, prompts: Sequence[Sequence[int]], *, max_tokens: int, temperature: float, seed: int | None
    ) -> list[Generated]:
        from megatron.core.inference.sampling_params import SamplingParams

        greedy = temperature == 0
        sp = SamplingParams(
            temperature=1.0 if greedy else float(temperature),
            top_k=1 if greedy else 0,
            num_tokens_to_generate=max_tokens,
            termination_id=self.tokenizer.eod,
            return_log_probs=True,
            skip_prompt_log_probs=True,
        )
        if seed is not None:
            torch.cuda.manual_seed(seed)
        records = self.llm.generate([list(map(int, p)) for p in prompts], sp)
        out = []
        for p, r in zip(prompts, records):
            toks = [
                int(t)
                for t in (
                    r.generated_tokens.tolist() if torch.is_tensor(r.generated_tokens) else (r.generated_tokens or [])
                )
            ]
            lps_raw = r.generated_log_probs
            lps = [float(x) for x in (lps_raw.tolist() if torch.is_tensor(lps_raw) else (lps_raw or []))]
            if len(lps) != len(toks):
                lps = (lps + [0.0] * len(toks))[: len(toks)]
            finish = "stop" if toks and toks[-1] == self.tokenizer.eod else "length"
            out.append(Generated(tuple(int(x) for x in p), tuple(toks), tuple(lps), finish))
        return out

    @on_own_device
    def suspend(self) -> float:
        """Suspend the engine (KV per mode, ``InferenceMode`` cleared); returns seconds taken."""
        t = time.perf_counter()
        self.engine.suspend()
        dt = time.perf_counter() - t
        self.timings.append(("suspend", dt))
        return dt

    @on_own_device
    def resume(self) -> float:
        """Resume the engine (KV restored per mode, ``InferenceMode`` set); returns seconds taken."""
        t = time.perf_counter()
        self.engine.resume()
        dt = time.perf_counter() - t
        self.timings.append(("resume", dt))
        return dt

    @on_own_device
    def shutdown(self) -> None:
        """Drop the engine and free its buffers."""
        self.engine.suspend()
        self.llm = None  # type: ignore[assignment]
        self.engine = None
        torch.cuda.empty_cache()


__all__ = ["DynamicBackend", "dynamic_engine_available"]
