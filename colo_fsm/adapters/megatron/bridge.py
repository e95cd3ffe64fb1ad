"""Megatron->HF export of a dual-mode model: register megatron-core's inference linear types with
megatron-bridge's ``AutoMapping`` so its parallelism detection knows how each one is sharded.

megatron-bridge decides how to gather a weight for export from the *class name* of the module that owns it
(``AutoMapping._MODULE_TYPE_REGISTRY``); a name it does not know raises "Cannot determine parallelism type".
``transformer_impl="inference_optimized"`` builds ``InferenceColumnParallelLinear``,
``InferenceLayerNormColumnParallelLinear`` and ``InferenceRowParallelLinear``, so a dual-mode model exports
only once these are registered (newer megatron-bridge releases list them already; registering is idempotent).
"""

from __future__ import annotations

import importlib.util

from colo_fsm.log import get_logger

log = get_logger(__name__)

INFERENCE_LINEAR_TYPES: dict[str, str] = {
    "InferenceColumnParallelLinear": "column",
    "InferenceLayerNormColumnParallelLinear": "column",  # its layer_norm_* weights: replicated (name rule)
    "InferenceRowParallelLinear": "row",
}
"""megatron-core 0.19 inference linear class names and their tensor-parallel layout."""


def megatron_bridge_available() -> tuple[bool, str]:
    """Whether megatron-bridge's ``AutoMapping`` is importable, and if not, why."""
    try:
        if importlib.util.find_spec("megatron.bridge") is None:
            return False, "megatron-bridge is not installed (pip install megatron-bridge; it needs Transformer Engine)"
        from megatron.bridge.models.conversion.param_mapping import AutoMapping  # noqa: F401
    except Exception as exc:  # an installed but broken bridge (e.g. no Transformer Engine)
        return False, f"megatron-bridge is not importable: {type(exc).__name__}: {exc}"
    return True, "megatron-bridge importable"


def register_inference_linear_types() -> dict[str, str]:
    """Register :data:`INFERENCE_LINEAR_TYPES` with megatron-bridge's ``AutoMapping``; returns what was
    registered (empty, with a log line saying why, when megatron-bridge is not importable)."""
    ok, why = megatron_bridge_available()
    if not ok:
        log.info("dual-mode export mapping not registered: %s", why)
        return {}
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    for name, kind in INFERENCE_LINEAR_TYPES.items():
        AutoMapping.register_module_type(name, kind)
    log.info("registered inference linear types with megatron-bridge AutoMapping: %s", INFERENCE_LINEAR_TYPES)
    return dict(INFERENCE_LINEAR_TYPES)


__all__ = ["INFERENCE_LINEAR_TYPES", "megatron_bridge_available", "register_inference_linear_types"]
