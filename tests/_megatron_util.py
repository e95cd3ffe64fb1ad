"""Shared helpers of the megatron adapter tests: a world-of-one gloo group per test module, tiny models."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def dist1():
    """torch.distributed (gloo, world of one) + megatron parallel state for one test module; torn down after."""
    from megatron.core.inference.utils import InferenceMode

    from colo_fsm.adapters.megatron.parallel import init_distributed, shutdown_distributed

    setup = init_distributed(1)
    yield setup
    InferenceMode.unset_active()
    shutdown_distributed()


def tiny(tok, **kw):
    """A tiny GPT for ``tok`` (2 layers, hidden 32 unless overridden)."""
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model

    args = {
        "vocab_size": tok.vocab_size,
        "hidden_size": 32,
        "num_layers": 2,
        "num_attention_heads": 4,
        "max_sequence_length": 32,
    }
    args.update(kw)
    return build_model(ModelConfig(**args))
