"""Build the one megatron-core GPT that both trains and generates.

Why ``GPTModel`` and not ``HybridModel``: megatron-core 0.19 logs a deprecation notice for ``GPTModel``
and points at ``HybridModel`` (the migration guide ``docs/user-guide/hybrid-model-migration.md``). But in
0.19.2 the only shipped hybrid stack spec (``models/hybrid/hybrid_layer_specs.py``) is built from Transformer
Engine modules, and neither our CPU machines nor the H200 image have Transformer Engine; ``GPTModel`` still
receives critical fixes, its local spec runs everywhere, and the dynamic inference engine's
``GPTInferenceWrapper`` targets it. Everything that touches the model class lives in this module, so moving
to ``HybridModel`` (pattern ``"*-*-"``: attention + MLP layers) is one function when a local spec exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from colo_fsm.adapters.engine.options import positive_int
from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger

log = get_logger(__name__)

_IMPLS = ("local", "inference_optimized")
_POS = ("learned_absolute", "rope")
_GRAPH_SCOPES = ("block", "layer")


def _pos_int(field: str, value: Any) -> int:
    return positive_int(field, value)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and placement of the tiny GPT.

    ``transformer_impl="inference_optimized"`` builds megatron-core's dual-mode layers (fast decode under
    inference mode, trainable Transformer Engine path otherwise); it needs Transformer Engine, and training
    on it is refused unless the trainer sets ``allow_inference_optimized_training``.
    ``cuda_graphs=True`` (CUDA only) builds the layers with ``cuda_graph_impl="local"`` and megatron-core's
    inference RNG tracker (``inference_rng_tracker=True``, seeded with ``model_parallel_cuda_manual_seed(...,
    inference_rng_tracker=True)``), so the dynamic engine can capture CUDA graphs for decode; pair it with
    ``GenerationConfig.num_cuda_graphs`` (without pre-captured shapes, lazily captured graphs are slower than eager).
    ``cuda_graph_scope`` is megatron-core's ``inference_cuda_graph_scope``: ``"block"`` (default) captures one graph
    per decoder block and leaves the layers without a graph manager, so a training forward never goes through
    one; ``"layer"`` gives every TransformerLayer a manager, which also intercepts each training forward (it
    records a training-graph runner per new sequence length and scans every captured runner per call). On one
    H200 (202M GPT, bf16) ``"block"`` decoded about 2x faster than ``"layer"``, captured in a third of the time
    and left the train step at its eager cost (``"layer"``: about 3x).
    ``num_moe_experts`` makes every MLP a mixture of experts (top-``moe_router_topk`` routing, all-to-all token
    dispatcher on CUDA and all-gather on the CPU, no auxiliary loss, no linear biases), sharded over ``expert_model_parallel_size`` ranks (initialize the groups
    with the same size: :func:`~colo_fsm.adapters.megatron.parallel.init_distributed`); with EP > 1 megatron-core
    generates only in coordinator mode (:mod:`colo_fsm.adapters.megatron.coordinator`).
    """

    vocab_size: int = 64
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    ffn_hidden_size: int | None = None
    max_sequence_length: int = 64
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    device: str = "cpu"
    bf16: bool | None = None  # None: bf16 on CUDA, fp32 on CPU
    tensor_model_parallel_size: int = 1
    position_embedding_type: str = "learned_absolute"
    transformer_impl: str = "local"
    seed: int = 1234
    cuda_graphs: bool = False
    cuda_graph_scope: str = "block"
    num_moe_experts: int | None = None  # None: dense MLPs; n: every MLP a mixture of n experts (local spec)
    moe_router_topk: int = 2
    expert_model_parallel_size: int = 1

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_attention_heads",
            "max_sequence_length",
            "tensor_model_parallel_size",
        ):
            _pos_int(name, getattr(self, name))
        if self.ffn_hidden_size is not None:
            _pos_int("ffn_hidden_size", self.ffn_hidden_size)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                "hidden_size", self.hidden_size, f"a multiple of num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.tensor_model_parallel_size:
            raise ConfigError(
                "tensor_model_parallel_size",
                self.tensor_model_parallel_size,
                f"a divisor of num_attention_heads={self.num_attention_heads}",
            )
        for name in ("hidden_dropout", "attention_dropout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < 1.0:
                raise ConfigError(name, v, "a number in [0, 1)")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", self.device, "'cpu' or 'cuda'")
        if self.position_embedding_type not in _POS:
            raise ConfigError("position_embedding_type", self.position_embedding_type, f"one of {_POS}")
        if self.device == "cpu" and self.position_embedding_type == "rope":
            raise ConfigError(
                "position_embedding_type",
                "rope",
                "'learned_absolute' on the CPU (megatron-core's RoPE moves its table to CUDA)",
            )
        if self.transformer_impl not in _IMPLS:
            raise ConfigError("transformer_impl", self.transformer_impl, f"one of {_IMPLS}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("seed", self.seed, "a non-negative integer")
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError("cuda_graphs", self.cuda_graphs, "True or False")
        if self.cuda_graphs and self.device != "cuda":
            raise ConfigError("cuda_graphs", self.cuda_graphs, "False on the CPU (CUDA graphs need device='cuda')")
        if self.cuda_graph_scope not in _GRAPH_SCOPES:
            raise ConfigError("cuda_graph_scope", self.cuda_graph_scope, f"one of {_GRAPH_SCOPES}")
        if self.num_moe_experts is not None:
            _pos_int("num_moe_experts", self.num_moe_experts)
            _pos_int("moe_router_topk", self.moe_router_topk)
            if self.moe_router_topk > self.num_moe_experts:
                raise ConfigError(
                    "moe_router_topk", self.moe_router_topk, f"at most num_moe_experts={self.num_moe_experts}"
                )
            if self.num_moe_experts % _pos_int("expert_model_parallel_size", self.expert_model_parallel_size):
                raise ConfigError(
                    "expert_model_parallel_size",
                    self.expert_model_parallel_size,
                    f"a divisor of num_moe_experts={self.num_moe_experts}",
                )
        elif self.expert_model_parallel_size != 1:
            raise ConfigError("expert_model_parallel_size", self.expert_model_parallel_size, "1 for a dense model")
        if self.bf16 is not None and not isinstance(self.bf16, bool):
            raise ConfigError("bf16", self.bf16, "True, False or None (bf16 on CUDA, fp32 on CPU)")

    @property
    def use_bf16(self) -> bool:
        """Whether parameters are bf16 (default: on CUDA)."""
        return self.device == "cuda" if self.bf16 is None else bool(self.bf16)


MODEL_PRESETS: dict[str, dict[str, int]] = {
    # ~202M parameters at a small vocabulary: the GPT of the H200 benches
    "gpt200m": {"hidden_size": 1024, "num_layers": 16, "num_attention_heads": 16},
    # ~1.0B parameters (12 x hidden^2 x layers): the "about 1B" shape of the reasoning bench
    "gpt1b": {"hidden_size": 2048, "num_layers": 20, "num_attention_heads": 16},
}
"""Named model shapes (hidden size, layers, heads); :func:`preset_config` builds a :class:`ModelConfig` from one."""


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    """A :class:`ModelConfig` of the preset ``name`` (see :data:`MODEL_PRESETS`), with ``overrides`` applied."""
    if name not in MODEL_PRESETS:
        raise ConfigError("model preset", name, f"one of {sorted(MODEL_PRESETS)}")
    return ModelConfig(**{**MODEL_PRESETS[name], **overrides})


def have_transformer_engine() -> bool:
    """Whether Transformer Engine is importable (needed by ``transformer_impl="inference_optimized"``)."""
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


def paged_attention_kwargs(
    device: str, *, capability: tuple[int, int] | None = None, have_fa4: bool | None = None
) -> dict[str, Any]:
    """``TransformerConfig`` settings that keep the dynamic engine's flash-attn-4 off split-KV on SM 9.x.

    megatron-core calls flash-attn-4 with ``num_splits=0`` (its heuristic), which picks several KV splits for a
    small batch over a long ``max_seqlen_k`` (more than 4 KV tiles: e.g. any CUDA-graph capture with
    ``max_sequence_length`` above 512 for head dim 64, or eager decode of a few long requests); on SM 9.0
    (H100/H200) flash-attn-4 then asserts "SplitKV not supported on SM 9.0". megatron-core's one setting for
    ``num_splits=1`` is ``batch_invariant_mode``, which asks for the flash backend pinned to version 4 (it only
    changes the attention calls' ``num_splits``; the training path here is :class:`SDPAttention`). Empty on the
    CPU, on other architectures and without flash-attn-4. ``capability``/``have_fa4`` default to this machine's.
    """
    if device != "cuda":
        return {}
    if capability is None:
        import torch

        if not torch.cuda.is_available():
            return {}
        capability = tuple(torch.cuda.get_device_capability())  # type: ignore[assignment]
    if have_fa4 is None:
        from megatron.core.transformer import attention as mattn

        have_fa4 = bool(getattr(mattn, "HAVE_FA4", False))
    if capability is None or capability[0] != 9 or not have_fa4:
        return {}
    from megatron.core.transformer.enums import AttnBackend

    return {"batch_invariant_mode": True, "attention_backend": AttnBackend.flash, "flash_attention_version": 4}


def transformer_config(cfg: ModelConfig) -> Any:
    """The megatron-core ``TransformerConfig`` of ``cfg`` (the training config the parallelism check reads)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if cfg.use_bf16 else torch.float32
    kwargs: dict[str, Any] = {}
    if cfg.transformer_impl == "inference_optimized":
        # megatron-core requires these for the inference-optimized layers
        kwargs.update(normalization="RMSNorm", add_bias_linear=False, add_qkv_bias=False)
    if cfg.cuda_graphs:  # decode CUDA graphs: the local graph implementation needs the inference RNG tracker
        kwargs.update(
            cuda_graph_impl="local", inference_rng_tracker=True, inference_cuda_graph_scope=cfg.cuda_graph_scope
        )
    paged = paged_attention_kwargs(cfg.device)
    if paged and cfg.attention_dropout > 0:  # megatron-core refuses batch_invariant_mode with attention dropout
        log.warning(
            "attention_dropout=%s: flash-attn-4 on this GPU may pick split-KV and fail for long sequences "
            "(set attention_dropout=0 to pin num_splits=1)",
            cfg.attention_dropout,
        )
        paged = {}
    kwargs.update(paged)
    if cfg.num_moe_experts is not None:  # token-choice top-k routing, no auxiliary loss, no token dropping
        kwargs.update(
            num_moe_experts=cfg.num_moe_experts,
            moe_router_topk=cfg.moe_router_topk,
            # all-to-all on the GPU (what expert-parallel runs use); it creates CUDA streams, so all-gather on the CPU
            moe_token_dispatcher_type="alltoall" if cfg.device == "cuda" else "allgather",
            moe_aux_loss_coeff=0.0,
            expert_model_parallel_size=cfg.expert_model_parallel_size,
            # no linear biases: megatron-core 0.19.2's expert MLP adds its bias in place to a view returned by the
            # model-parallel reduce, which autograd refuses in a training forward (seen on one H200)
            add_bias_linear=False,
        )
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        ffn_hidden_size=cfg.ffn_hidden_size,
        hidden_dropout=cfg.hidden_dropout,
        attention_dropout=cfg.attention_dropout,
        tensor_model_parallel_size=cfg.tensor_model_parallel_size,
        use_cpu_initialization=cfg.device == "cpu",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=cfg.use_bf16,
        transformer_impl=cfg.transformer_impl,
        **kwargs,
    )


def layer_spec(cfg: ModelConfig) -> Any:
    """The layer spec: megatron-core's local spec with :class:`SDPAttention` as core attention, or the
    inference-optimized spec (Transformer Engine) for a dual-mode model."""
    if cfg.transformer_impl == "inference_optimized":
        if not have_transformer_engine():
            raise ConfigError(
                "transformer_impl",
                cfg.transformer_impl,
                "'local' (inference_optimized layers are Transformer Engine modules, and "
                "transformer_engine is not importable here)",
            )
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_inference_spec

        return get_gpt_layer_with_inference_spec()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from colo_fsm.adapters.megatron.attention import SDPAttention

    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False)
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def build_model(cfg: ModelConfig) -> Any:
    """Build the GPT on ``cfg.device`` (megatron parallel state must be initialized, see
    :func:`~colo_fsm.adapters.megatron.parallel.init_distributed`). Returns it in eval mode."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_model import GPTModel

    if not ps.model_parallel_is_initialized():
        raise ConfigError("parallel_state", None, "initialized first (colo_fsm.adapters.megatron.init_distributed)")
    if ps.get_tensor_model_parallel_world_size() != cfg.tensor_model_parallel_size:
        raise ConfigError(
            "tensor_model_parallel_size",
            cfg.tensor_model_parallel_size,
            f"the initialized TP size {ps.get_tensor_model_parallel_world_size()}",
        )
    if ps.get_expert_model_parallel_world_size() != cfg.expert_model_parallel_size:
        raise ConfigError(
            "expert_model_parallel_size",
            cfg.expert_model_parallel_size,
            f"the initialized EP size {ps.get_expert_model_parallel_world_size()}",
        )
    if cfg.transformer_impl == "inference_optimized":
        _register_export_types()
    # The same seed on every rank: with CPU initialization megatron-core draws each full weight and keeps
    # this TP rank's slice, so all ranks must draw the same numbers; DP replicas start identical.
    torch.manual_seed(cfg.seed)
    if cfg.device == "cuda":
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        if cfg.cuda_graphs:  # a tracker built without inference_rng_tracker refuses graphs: rebuild it
            model_parallel_cuda_manual_seed(cfg.seed, inference_rng_tracker=True, force_reset_rng=True)
        else:
            model_parallel_cuda_manual_seed(cfg.seed)
    tcfg = transformer_config(cfg)
    model = GPTModel(
        config=tcfg,
        transformer_layer_spec=layer_spec(cfg),
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.max_sequence_length,
        position_embedding_type=cfg.position_embedding_type,
        parallel_output=False,  # gather logits over TP: the GRPO loss reads full-vocabulary log-probs
        share_embeddings_and_output_weights=False,
    )
    if cfg.device == "cuda":
        model = model.cuda()
        if cfg.use_bf16:
            model = model.bfloat16()
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    log.info(
        "built GPTModel: %d layers, hidden %d, vocab %d, %d parameters on this rank, device=%s",
        cfg.num_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        n,
        cfg.device,
    )
    return model


def _register_export_types() -> None:
    """A dual-mode model exports to HF only once megatron-bridge knows its inference linear types: register
    them (a log line says why not when megatron-bridge is absent; a failure there never stops the build)."""
    from colo_fsm.adapters.megatron import bridge

    try:
        bridge.register_inference_linear_types()
    except Exception as exc:  # an export-side registry must not break training or generation
        log.warning("could not register the inference linear types with megatron-bridge: %s", exc)


def check_trainable(config: Any, *, allow_inference_optimized_training: bool) -> None:
    """Refuse to train a dual-mode (``transformer_impl="inference_optimized"``) model unless opted in."""
    impl = getattr(config, "transformer_impl", "local")
    if impl == "inference_optimized" and not allow_inference_optimized_training:
        raise ConfigError(
            "allow_inference_optimized_training",
            allow_inference_optimized_training,
            "True to train an inference_optimized model: its layers run fast decode kernels only under "
            "megatron-core's InferenceMode and fall back to the Transformer Engine training path otherwise, "
            "so training it is opt-in (verify the fallback path and the Megatron->HF export of the "
            "Inference* linear types first)",
        )


__all__ = [
    "MODEL_PRESETS",
    "ModelConfig",
    "build_model",
    "check_trainable",
    "have_transformer_engine",
    "layer_spec",
    "paged_attention_kwargs",
    "preset_config",
    "transformer_config",
]
