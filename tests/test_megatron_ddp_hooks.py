"""The shared mode control switches DDP's param-gather forward pre-hooks, even for a DDP made after the engine:
off from bring-up (no hook runs in decode), on at suspend (training forwards run them), off again at resume with
a parameter sync. On the CPU a stand-in with megatron-core DDP's hook API takes the place of its DDP (which needs
CUDA); tests/test_megatron_trainer_gpu.py runs the real one."""

from __future__ import annotations

import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron.cpu_loop import forward_logits
from colo_fsm.adapters.megatron.engine import MegatronEngine
from colo_fsm.adapters.megatron.mode import mode_control
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.guards.mode import check_training_mode

TOK = CharTokenizer("0123456789>")


class HookedDDP(torch.nn.Module):
    """megatron-core DDP's param-gather hook API (``overlap_param_gather=True``): hooks registered when built."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.use_forward_hook = True
        self.remove_forward_pre_hook_handles: dict = {}
        self.hook_calls = 0
        self.param_syncs = 0
        self.enable_forward_pre_hook()

    def enable_forward_pre_hook(self) -> None:
        assert not self.remove_forward_pre_hook_handles
        for m in self.module.modules():
            self.remove_forward_pre_hook_handles[m] = m.register_forward_pre_hook(self._hook)

    def disable_forward_pre_hook(self, param_sync: bool = True) -> None:
        for h in self.remove_forward_pre_hook_handles.values():
            h.remove()
        self.remove_forward_pre_hook_handles.clear()
        self.param_syncs += int(param_sync)

    def _hook(self, *_: object) -> None:
        self.hook_calls += 1

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_hooks_follow_the_lifecycle_for_a_ddp_made_after_the_engine(dist1):  # noqa: F811
    model = tiny(TOK)
    eng = MegatronEngine(model, TOK)  # the engine's mode control first, before any DDP exists
    ddp = HookedDDP(model)
    control = mode_control(ddp)
    assert control is eng.mode and control.training.param_gather_hooks is True
    eng.bring_up()
    assert control.read().param_gather_hooks is False and ddp.param_syncs == 1
    calls = ddp.hook_calls
    eng.generate(["12>", "7>"], max_tokens=3)
    assert ddp.hook_calls == calls  # decode never runs a param-gather hook
    for _ in range(2):
        eng.suspend()
        assert control.read().param_gather_hooks is True
        check_training_mode(control.report())  # training is allowed: every switch in its training position
        tokens = torch.tensor([TOK.tokenize("123>")])
        forward_logits(ddp, tokens, torch.ones_like(tokens, dtype=torch.bool))
        assert ddp.hook_calls > calls  # a training forward runs them
        calls = ddp.hook_calls
        syncs = ddp.param_syncs
        eng.resume()
        assert control.read().param_gather_hooks is False and ddp.param_syncs == syncs + 1
        eng.generate(["12>"], max_tokens=2)
        assert ddp.hook_calls == calls
    eng.shutdown()


def test_the_mode_control_does_not_keep_a_model_alive(dist1):  # noqa: F811
    """A run that builds a model per phase (the benches do) frees each one: its control lives on the model."""
    import gc
    import weakref

    model = tiny(TOK)
    control = mode_control(HookedDDP(model))
    assert mode_control(model) is control
    ref = weakref.ref(model)
    del model, control
    gc.collect()
    assert ref() is None
