"""Parallelism must match: TP/PP/EP/ETP raise naming both values; CP warns."""

import warnings

import pytest

from colo_fsm.errors import ConfigError, ParallelismMismatch
from colo_fsm.guards.parallelism import ParallelismWarning, check_parallelism


@pytest.mark.parametrize(
    "field",
    [
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
    ],
)
def test_weight_sharding_mismatch_raises_with_both_values(field):
    with pytest.raises(ParallelismMismatch) as info:
        check_parallelism({field: 2}, {field: 4})
    msg = str(info.value)
    assert field in msg and "4" in msg and "2" in msg
    assert info.value.training == 2 and info.value.generation == 4


def test_context_parallel_mismatch_warns():
    with pytest.warns(ParallelismWarning, match="context_parallel_size"):
        result = check_parallelism({"context_parallel_size": 1}, {"cp": 2})
    assert result.warnings


def test_matching_and_unset_generation_fields_pass():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = check_parallelism({"tp": 2, "pp": 2}, {"tp": 2})
        assert r.compared == ("tensor_model_parallel_size",)
        assert check_parallelism({"tp": 2}, None).compared == ()


def test_etp_defaults_to_tp_on_the_training_side():
    check_parallelism({"tp": 4}, {"etp": 4})
    with pytest.raises(ParallelismMismatch, match="expert_tensor_parallel_size"):
        check_parallelism({"tp": 4}, {"etp": 2})


def test_accepts_megatron_transformer_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, tensor_model_parallel_size=1)
    check_parallelism(cfg, {"tp": 1, "pp": 1})
    with pytest.raises(ParallelismMismatch, match="tensor_model_parallel_size"):
        check_parallelism(cfg, {"tensor_model_parallel_size": 2})


@pytest.mark.parametrize("bad", [0, -2, "2", 1.5])
def test_nonsense_sizes_are_config_errors(bad):
    with pytest.raises(ConfigError, match="generation.tensor_model_parallel_size"):
        check_parallelism({"tp": 1}, {"tp": bad})


def test_missing_training_config():
    with pytest.raises(ConfigError, match="training_config"):
        check_parallelism(None, {"tp": 1})
