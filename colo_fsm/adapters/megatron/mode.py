"""What megatron-core 0.19 really toggles on the shared model for decoding, read and restored in one place.

The switches (see :class:`~colo_fsm.guards.mode.ModelMode`):

* ``InferenceMode`` (``megatron.core.inference.utils``): the process-wide flag the dynamic engine sets on
  bring-up / resume and clears on suspend; MoE layers and fused-TP paths read it in every forward;
* CUDA graphs: ``config.cuda_graph_impl`` and the per-module ``cudagraph_manager`` attributes that
  ``megatron.core.transformer.utils.toggle_cuda_graphs`` removes ("none") and restores from its cache ("local");
  a layer that still holds a manager routes a *training* forward through it too;
* decode-time expert padding: ``set_decode_expert_padding`` flips ``moe_pad_expert_input_to_capacity`` and
  ``moe_expert_capacity_factor`` on the config, every token dispatcher (``drop_and_pad``) and router, per decode
  step, from rank-local state;
* the inference token dispatcher: an ``inference_optimized`` MoE layer swaps ``token_dispatcher`` for
  ``_inference_token_dispatcher`` while ``InferenceMode`` is set (and leaves it there until the next forward);
* distributed-optimizer param-gather forward pre-hooks of megatron-core's ``DistributedDataParallel``
  (``overlap_param_gather``): they all-gather parameters from inside a forward, so they must be off while
  decoding and on for training.

:class:`MegatronModeControl` snapshots the training values when it is first made for a model (before the
engine comes up), resets every switch to them on suspend (the same steps on every rank, reading nothing
rank-local) and re-applies the decode-side switches the engine does not set itself on resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from colo_fsm.guards.mode import ModelMode, ModeReport
from colo_fsm.log import get_logger

log = get_logger(__name__)


def _unwrap(model: Any) -> tuple[Any, list[Any]]:
    """The innermost module (the GPT model) and the wrappers around it (DDP, Float16Module, ...)."""
    wrappers: list[Any] = []
    inner = model
    while hasattr(inner, "module") and hasattr(inner.module, "modules"):
        wrappers.append(inner)
        inner = inner.module
    return inner, wrappers


def _moe_layers(model: Any) -> list[Any]:
    try:
        from megatron.core.transformer.moe.moe_layer import MoELayer
    except Exception:  # pragma: no cover - megatron-core without MoE support
        return []
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def _hook_owners(wrappers: list[Any]) -> list[Any]:
    """DDP wrappers that register param-gather forward pre-hooks (``overlap_param_gather``)."""
    return [w for w in wrappers if getattr(w, "use_forward_hook", False)]


class MegatronModeControl:
    """Reads, resets and re-applies the inference-only switches of one megatron-core model.

    ``training_cuda_graphs`` keeps the model's local CUDA-graph managers during training (off by default:
    decode graphs are removed for the training forward and restored on resume).
    """

    def __init__(self, model: Any, *, training_cuda_graphs: bool = False) -> None:
        self.model = model
        self.inner, self.wrappers = _unwrap(model)
        self.config = getattr(self.inner, "config", None)
        self.moe = _moe_layers(self.inner)
        self.training_cuda_graphs = training_cuda_graphs
        base = self.read()
        self.decode_cuda_graph_impl = base.cuda_graph_impl
        graphs_in_training = training_cuda_graphs or base.cuda_graph_impl != "local"
        self.training = ModelMode(
            inference_mode=False,
            cuda_graph_impl=base.cuda_graph_impl if graphs_in_training else "none",
            cuda_graph_managers=base.cuda_graph_managers if graphs_in_training else 0,
            expert_padding=base.expert_padding,
            expert_capacity_factor=base.expert_capacity_factor,
            inference_dispatchers=0 if base.inference_dispatchers is not None else None,
            param_gather_hooks=True if base.param_gather_hooks is not None else None,
        )

    # ------------------------------------------------------------------ reading
    def read(self) -> ModelMode:
        """The switches as they are now."""
        from megatron.core.inference.utils import InferenceMode

        cfg = self.config
        padding: bool | None = None
        capacity: float | None = None
        dispatchers: int | None = None
        if self.moe:
            padding = bool(getattr(cfg, "moe_pad_expert_input_to_capacity", False)) or any(
                bool(getattr(m.token_dispatcher, "drop_and_pad", False)) for m in self.moe
            )
            cf = getattr(cfg, "moe_expert_capacity_factor", None)
            capacity = None if cf is None else float(cf)
            dispatchers = sum(
                1
                for m in self.moe
                if getattr(m, "_inference_token_dispatcher", None) is not None
                and m.token_dispatcher is m._inference_token_dispatcher
            )
        owners = _hook_owners(self.wrappers)
        hooks = any(bool(getattr(w, "remove_forward_pre_hook_handles", None)) for w in owners) if owners else None
        return ModelMode(
            inference_mode=bool(InferenceMode.is_active()),
            cuda_graph_impl=str(getattr(cfg, "cuda_graph_impl", "none") or "none"),
            cuda_graph_managers=sum(1 for m in self.inner.modules() if hasattr(m, "cudagraph_manager")),
            expert_padding=padding,
            expert_capacity_factor=capacity,
            inference_dispatchers=dispatchers,
            param_gather_hooks=hooks,
        )

    def report(self) -> ModeReport:
        """The current mode and the mode training needs."""
        return ModeReport(current=self.read(), training=self.training)

    # ------------------------------------------------------------------ switching
    def to_training(self) -> None:
        """Reset every switch to its training value (suspend; the same steps on every rank)."""
        from megatron.core.inference.utils import InferenceMode

        InferenceMode.unset_active()
        want = self.training
        if self.read().cuda_graph_impl == "local" and want.cuda_graph_impl == "none":
            from megatron.core.transformer.utils import toggle_cuda_graphs

            toggle_cuda_graphs(self.inner, set_to="none")
        if self.moe:
            self._set_expert_padding(bool(want.expert_padding), want.expert_capacity_factor)
            for m in self.moe:
                training_dispatcher = getattr(m, "_training_token_dispatcher", None)
                if training_dispatcher is not None and m.token_dispatcher is not training_dispatcher:
                    m.token_dispatcher = training_dispatcher
                    m.shared_expert_overlap = getattr(self.config, "moe_shared_expert_overlap", False)
        for w in _hook_owners(self.wrappers):
            if not w.remove_forward_pre_hook_handles:
                w.enable_forward_pre_hook()

    def to_inference(self) -> None:
        """Re-apply the decode-side switches the engine does not set itself (resume, before the engine's own).

        Param-gather hooks go off (after one forced parameter sync, so decode reads the updated weights) and
        decode CUDA graphs come back. ``InferenceMode``, expert padding and the token dispatcher are set by the
        engine and the layers themselves, per step and per forward.
        """
        for w in _hook_owners(self.wrappers):
            if w.remove_forward_pre_hook_handles:
                w.disable_forward_pre_hook(param_sync=True)
        if self.decode_cuda_graph_impl == "local" and self.read().cuda_graph_impl != "local":
            from megatron.core.transformer.utils import toggle_cuda_graphs

            toggle_cuda_graphs(self.inner, set_to="local")

    def adopt_wrappers(self, wrappers: list[Any]) -> None:
        """Track wrappers made after this control (a trainer's DDP around a model an engine already knows).

        A DDP with ``overlap_param_gather`` registers its param-gather hooks when built; from then on training
        needs them on. Built while the engine decodes (``InferenceMode`` set), they are switched off at once,
        as a resume would.
        """
        new = [w for w in wrappers if all(w is not known for known in self.wrappers)]
        if not new:
            return
        self.wrappers = [*new, *self.wrappers]
        if _hook_owners(new):
            self.training = dataclasses.replace(self.training, param_gather_hooks=True)
            from megatron.core.inference.utils import InferenceMode

            if InferenceMode.is_active():
                for w in _hook_owners(new):
                    if w.remove_forward_pre_hook_handles:
                        w.disable_forward_pre_hook(param_sync=False)

    def _set_expert_padding(self, pad: bool, capacity_factor: float | None) -> None:
        cfgs = [self.config]
        for m in self.moe:
            d = m.token_dispatcher
            d.drop_and_pad = pad
            d.moe_expert_capacity_factor = capacity_factor
            cfgs += [getattr(d, "config", None), getattr(m.router, "config", None)]
            m.router.moe_expert_capacity_factor = capacity_factor
        for cfg in cfgs:
            if cfg is not None:
                cfg.moe_pad_expert_input_to_capacity = pad
                cfg.moe_expert_capacity_factor = capacity_factor


_ATTR = "_colo_fsm_mode_control"
"""Where a model keeps its control: an attribute of the model itself, so the two live and die together (a global
weak-keyed registry would keep every model alive: its value refers to the key)."""


def mode_control(model: Any, **kwargs: Any) -> MegatronModeControl:
    """The one :class:`MegatronModeControl` of ``model`` (engine and trainer share it; made on first use)."""
    inner, wrappers = _unwrap(model)
    control = inner.__dict__.get(_ATTR)
    if control is None:
        control = MegatronModeControl(model, **kwargs)
        object.__setattr__(inner, _ATTR, control)  # a plain attribute, not a submodule or a buffer
    else:
        control.adopt_wrappers(wrappers)
    return control


__all__ = ["MegatronModeControl", "mode_control"]
