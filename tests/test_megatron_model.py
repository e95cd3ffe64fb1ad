"""The model builder, the SDPA core attention and the dual-mode (inference_optimized) training opt-in."""

from __future__ import annotations

import math

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron.attention import SDPAttention
from colo_fsm.adapters.megatron.model import (
    ModelConfig,
    check_trainable,
    have_transformer_engine,
    layer_spec,
    paged_attention_kwargs,
    transformer_config,
)
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.errors import ConfigError


def test_layer_spec_uses_sdpa_core_attention():
    spec = layer_spec(ModelConfig())
    assert spec.submodules.self_attention.submodules.core_attention is SDPAttention


def test_built_model_has_sdpa_and_runs_on_cpu(dist1):  # noqa: F811
    tok = CharTokenizer("0123456789>")
    m = tiny(tok)
    cores = [mod for mod in m.modules() if isinstance(mod, SDPAttention)]
    assert len(cores) == 2
    ids = torch.tensor([tok.tokenize("123>")])
    logits = m(ids, torch.arange(4).unsqueeze(0), None, runtime_gather_output=True)
    assert logits.shape == (1, 4, tok.vocab_size)
    assert torch.isfinite(logits).all()


def test_sdpa_matches_reference_causal_attention():
    class Cfg:
        attention_dropout = 0.0
        context_parallel_size = 1

    from megatron.core.transformer.enums import AttnMaskType

    core = SDPAttention.__new__(SDPAttention)
    torch.nn.Module.__init__(core)
    core.config, core.dropout_p, core.softmax_scale, core.attn_mask_type = Cfg(), 0.0, None, AttnMaskType.causal
    s, b, h, d = 5, 2, 3, 4
    q, k, v = (torch.randn(s, b, h, d) for _ in range(3))
    out = core(q, k, v, None)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
    ref = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v).reshape(s, b, h * d)
    assert out.shape == (s, b, h * d)
    assert torch.allclose(out, ref, atol=1e-5)
    # megatron convention: True in the mask = masked out; an explicit causal mask gives the same result
    mask = torch.ones(s, s).triu(1).bool().expand(b, 1, s, s)
    assert torch.allclose(core(q, k, v, mask), ref, atol=1e-5)


def test_sdpa_never_uses_cudnn_attention(monkeypatch):
    """cuDNN attention builds a plan per new sequence length (seconds in a train step): SDPAttention excludes it."""
    from megatron.core.transformer.enums import AttnMaskType

    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **k):
        b = torch.backends.cuda
        seen.append((b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()))
        return real(*a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    core = SDPAttention.__new__(SDPAttention)
    torch.nn.Module.__init__(core)
    core.dropout_p, core.softmax_scale, core.attn_mask_type = 0.0, None, AttnMaskType.causal
    q = torch.randn(3, 1, 2, 4)
    before = torch.backends.cuda.cudnn_sdp_enabled()  # torch's backend flags are process-wide, not per thread
    core(q, q, q, None)
    assert seen == [(False, True, True, True)]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before  # restored after the call


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("hidden_size", {"hidden_size": 30, "num_attention_heads": 4}),
        ("device", {"device": "tpu"}),
        ("position_embedding_type", {"position_embedding_type": "rope"}),
        ("transformer_impl", {"transformer_impl": "fast"}),
        ("vocab_size", {"vocab_size": 0}),
        ("hidden_dropout", {"hidden_dropout": 1.5}),
    ],
)
def test_bad_model_config_names_the_field(field, kwargs):
    with pytest.raises(ConfigError) as exc:
        ModelConfig(**kwargs)
    assert exc.value.field == field
    assert "expected" in str(exc.value)


def _inference_optimized_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        transformer_impl="inference_optimized",
        normalization="RMSNorm",
        add_bias_linear=False,
        use_cpu_initialization=True,
    )


def test_training_an_inference_optimized_model_is_refused_unless_opted_in():
    cfg = _inference_optimized_config()
    with pytest.raises(ConfigError) as exc:
        check_trainable(cfg, allow_inference_optimized_training=False)
    assert exc.value.field == "allow_inference_optimized_training"
    assert "InferenceMode" in str(exc.value) and "opt-in" in str(exc.value)
    check_trainable(cfg, allow_inference_optimized_training=True)  # opted in: allowed
    check_trainable(ModelConfig(), allow_inference_optimized_training=False)  # local models: always allowed


def test_trainer_refuses_inference_optimized_model(dist1):  # noqa: F811
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    tok = CharTokenizer("0123456789>")
    m = tiny(tok)
    m.config = _inference_optimized_config()  # what a dual-mode model reports
    with pytest.raises(ConfigError, match="allow_inference_optimized_training"):
        MegatronTrainer(m, TrainerConfig())
    MegatronTrainer(m, TrainerConfig(allow_inference_optimized_training=True))


def test_inference_optimized_build_needs_transformer_engine():
    if have_transformer_engine():
        pytest.skip("Transformer Engine is installed: the inference_optimized build is exercised on the GPU")
    with pytest.raises(ConfigError) as exc:
        layer_spec(ModelConfig(transformer_impl="inference_optimized"))
    assert "Transformer Engine" in exc.value.expected


@pytest.mark.gpu
def test_inference_optimized_model_builds_with_transformer_engine(dist1):  # noqa: F811
    if not (torch.cuda.is_available() and have_transformer_engine()):
        pytest.skip(
            "needs a CUDA device and Transformer Engine (inference_optimized layers are TE modules); "
            f"cuda={torch.cuda.is_available()} transformer_engine={have_transformer_engine()}"
        )
    tok = CharTokenizer("0123456789>")
    m = tiny(tok, device="cuda", transformer_impl="inference_optimized")
    assert m.config.transformer_impl == "inference_optimized"


def test_bridge_registration_guarded():
    from colo_fsm.adapters.megatron.bridge import (
        INFERENCE_LINEAR_TYPES,
        megatron_bridge_available,
        register_inference_linear_types,
    )

    ok, why = megatron_bridge_available()
    if not ok:
        assert register_inference_linear_types() == {}
        pytest.skip(f"megatron-bridge not importable here: {why}")
    registered = register_inference_linear_types()
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    for name, kind in INFERENCE_LINEAR_TYPES.items():
        assert registered[name] == kind
        assert name in AutoMapping._MODULE_TYPE_REGISTRY[kind]


def test_paged_attention_single_split_only_for_fa4_on_sm90():
    """flash-attn-4 on SM 9.0 refuses split-KV: the config pins num_splits=1 there (batch_invariant_mode)."""
    from megatron.core.transformer.enums import AttnBackend

    kw = paged_attention_kwargs("cuda", capability=(9, 0), have_fa4=True)
    assert kw == {"batch_invariant_mode": True, "attention_backend": AttnBackend.flash, "flash_attention_version": 4}
    assert paged_attention_kwargs("cuda", capability=(10, 0), have_fa4=True) == {}  # Blackwell splits KV fine
    assert paged_attention_kwargs("cuda", capability=(9, 0), have_fa4=False) == {}  # FA3/FA2 path untouched
    assert paged_attention_kwargs("cpu", capability=(9, 0), have_fa4=True) == {}
    # megatron-core accepts the combination (its __post_init__ checks backend, version, CP and dropout)
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0, **kw)
    assert cfg.batch_invariant_mode and cfg.flash_attention_version == 4


def test_cuda_graph_scope_defaults_to_block_and_is_checked():
    cfg = transformer_config(ModelConfig(vocab_size=16, device="cuda", cuda_graphs=True))
    assert cfg.inference_cuda_graph_scope.name == "block" and cfg.cuda_graph_impl == "local"
    cfg = transformer_config(ModelConfig(vocab_size=16, device="cuda", cuda_graphs=True, cuda_graph_scope="layer"))
    assert cfg.inference_cuda_graph_scope.name == "layer"
    with pytest.raises(ConfigError) as exc:
        ModelConfig(cuda_graph_scope="model")
    assert exc.value.field == "cuda_graph_scope" and "block" in exc.value.expected
