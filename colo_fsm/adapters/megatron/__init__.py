"""The thin megatron-core adapter: one GPT object that both trains and generates (megatron-core 0.19.x).

* :mod:`.model`: build the model (local spec + :class:`SDPAttention`; dual-mode opt-in check)
* :mod:`.parallel`: ``torch.distributed`` + megatron parallel state (gloo on CPU, NCCL on GPU)
* :mod:`.engine`: :class:`MegatronEngine` (``GenerationEngine`` + ``TextGenerator``); :mod:`.engine_config`: its
  settings (:class:`GenerationConfig`) and the KV-cache modes
* :mod:`.coordinator`: :class:`CoordinatorEngine`, megatron-core's coordinator mode (``MegatronAsyncLLM``,
  needed for expert parallelism); :mod:`.coordinator_states` maps its ``EngineState`` onto the lifecycle
* :mod:`.dynamic` / :mod:`.cpu_loop`: the GPU (dynamic engine) and CPU generation paths
* :mod:`.trainer`: :class:`MegatronTrainer` (GRPO loss, AdamW, offload/restore, checkpoints)
* :mod:`.checkpoint`: atomic ``dist_checkpointing`` save/load with per-rank extra state
* :mod:`.bridge`: register inference linear types with megatron-bridge's export mapping
* :mod:`.tokenizer`: a character tokenizer megatron-core's controller accepts
* :mod:`.refit`: an example vLLM-style engine the lifecycle refuses

Importing this package does not import megatron-core; the submodules do.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "CharTokenizer": "tokenizer",
    "CheckpointInfo": "checkpoint",
    "CoordinatorConfig": "coordinator",
    "CoordinatorEngine": "coordinator",
    "DistributedSetup": "parallel",
    "GenerationConfig": "engine_config",
    "KVCacheMode": "engine_config",
    "MegatronEngine": "engine",
    "MegatronTrainer": "trainer",
    "ModelConfig": "model",
    "RefitEngine": "refit",
    "Rollout": "trainer",
    "SDPAttention": "attention",
    "TokenCompletion": "engine",
    "TrainerConfig": "trainer",
    "build_model": "model",
    "check_trainable": "model",
    "group_advantages": "trainer",
    "init_distributed": "parallel",
    "latest_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "parse_kv_cache_mode": "engine_config",
    "register_inference_linear_types": "bridge",
    "save_checkpoint": "checkpoint",
    "shutdown_distributed": "parallel",
    "transformer_config": "model",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(name)


__all__ = sorted(_EXPORTS)
