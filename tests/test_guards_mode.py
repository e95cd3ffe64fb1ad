"""The shared model's mode, declared: real megatron-core models (dense and MoE) on the CPU, the megatron
adapter's suspend resetting every switch, and the guards that refuse a training step on a model still in an
inference mode (trainer adapter and lifecycle)."""

from __future__ import annotations

import pytest
import torch

from colo_fsm.errors import ModelModeError
from colo_fsm.guards.drain import NoDeviceDrain
from colo_fsm.guards.mode import ModelMode, ModeReport, check_training_mode, mode_digest, report_of
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.testing.fakes import Journal, ModalEngine, RecordingCollector, RecordingEngine, RecordingTrainer
from tests._megatron_util import dist1, tiny  # noqa: F401

pytest.importorskip("megatron.core")

from colo_fsm.adapters.megatron import CharTokenizer, MegatronEngine, MegatronTrainer, Rollout

TOK = CharTokenizer()


def test_engine_reports_inference_mode_and_suspend_restores_training_mode(dist1):  # noqa: F811
    from megatron.core.inference.utils import InferenceMode

    model = tiny(TOK)
    eng = MegatronEngine(model, TOK)
    trainer = MegatronTrainer(model, pad_id=TOK.pad)
    assert trainer.mode is eng.mode  # one record per model, shared by engine and trainer
    eng.bring_up()
    assert eng.model_mode().off_training() == [("inference_mode", True, False)]
    eng.suspend()
    assert eng.model_mode().off_training() == []
    InferenceMode.set_active()  # something left the flag set after the suspend
    with pytest.raises(ModelModeError) as info:
        trainer.train_step([Rollout((1, 2), (3, 4), 1.0, 0), Rollout((1, 2), (4, 3), 0.0, 0)])
    assert info.value.fields == [("inference_mode", True, False)]
    assert "inference_mode=True (training needs False)" in str(info.value)
    assert trainer.steps == 0  # refused before any forward
    eng.resume()
    eng.suspend()
    trainer.train_step([Rollout((1, 2), (3, 4), 1.0, 0), Rollout((1, 2), (4, 3), 0.0, 0)])
    assert trainer.steps == 1
    eng.shutdown()
    assert not InferenceMode.is_active()


def test_moe_decode_padding_is_read_and_reset_identically(dist1):  # noqa: F811
    """megatron-core's own set_decode_expert_padding on a real MoE GPT; the reset needs no rank-local state."""
    from megatron.core.inference.utils import set_decode_expert_padding
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from colo_fsm.adapters.megatron.attention import SDPAttention
    from colo_fsm.adapters.megatron.mode import MegatronModeControl

    spec = get_gpt_layer_local_spec(num_experts=2, moe_grouped_gemm=False)
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        use_cpu_initialization=True,
        num_moe_experts=2,
        moe_router_topk=1,
        moe_router_pre_softmax=True,
        moe_token_dispatcher_type="allgather",
        moe_aux_loss_coeff=0.0,
    )
    torch.manual_seed(0)
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=spec,
        vocab_size=64,
        max_sequence_length=16,
        share_embeddings_and_output_weights=False,
    )
    control = MegatronModeControl(model)
    clean = control.report()
    assert clean.off_training() == [] and clean.current.expert_padding is False
    set_decode_expert_padding(model, True, capacity_factor=2.0)  # what a CUDA-graph decode step does
    assert control.report().off_training() == [("expert_padding", True, False), ("expert_capacity_factor", 2.0, None)]
    assert mode_digest(control.report()) != mode_digest(clean)
    control.to_training()
    assert control.report() == clean and mode_digest(control.report()) == mode_digest(clean)
    assert all(not layer.token_dispatcher.drop_and_pad for layer in control.moe)


def test_lifecycle_refuses_to_train_on_a_model_left_in_decode_mode():
    j = Journal()
    engine = ModalEngine(j, reset_on_suspend=False)
    trainer = RecordingTrainer(j)
    lc = Lifecycle(engine, trainer, RecordingCollector(j), config=LifecycleConfig(num_steps=2), drain=NoDeviceDrain())
    lc.start()
    engine.decode_step(padding=True)
    with pytest.raises(ModelModeError) as info:
        lc.step([1])
    assert info.value.fields == [("expert_padding", True, False)] and info.value.state == "Training"
    assert j.count("trainer", "train_step") == 0 and lc.state.value == "Failed"


def test_engines_that_report_nothing_are_not_checked_and_digest_is_stable():
    assert report_of(RecordingEngine()) is None and mode_digest(None) == 0
    check_training_mode(None)
    a = ModeReport(ModelMode(inference_mode=True), ModelMode())
    b = ModeReport(ModelMode(inference_mode=True), ModelMode())
    assert mode_digest(a) == mode_digest(b) > 0 and mode_digest(a) < 2**63
    assert mode_digest(ModeReport(ModelMode(), ModelMode())) != mode_digest(a)
