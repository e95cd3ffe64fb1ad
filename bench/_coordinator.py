"""``--engine coordinator`` for the handoff benchmarks: megatron-core's coordinator mode as the engine.

:func:`coordinator_engine` has the factory signature of ``bench/_handoff.py``'s ``ENGINES`` (``--engine``):
it builds :class:`~colo_fsm.adapters.megatron.coordinator.CoordinatorEngine` over the mode's model. Park is
megatron's own pause/suspend (requests kept in the engine); drain is the collector waiting for its rollouts
before the pause (the engine has nothing to drain on its own); sync is unchanged. GPU only, with pyzmq and
msgpack. megatron-core 0.19.2 samples every request from one generator: a per-request seed is not applied on
this path (the engine counts them), so sampled outputs differ from the direct path's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def coordinator_engine(
    mode: str,
    args: Any,
    shape: Any,
    model: Any,
    tokenizer: Any,
    weight_version: Callable[[], int],
    max_sequence_length: int,
) -> Any:
    """The coordinator-mode engine for one bench mode (see the module docstring)."""
    from colo_fsm.adapters.megatron.coordinator import CoordinatorConfig, CoordinatorEngine, coordinator_dependencies

    if getattr(args, "device", "cuda") != "cuda":
        raise SystemExit("--engine coordinator needs --device cuda (megatron-core's dynamic engine runs on a GPU)")
    ok, why = coordinator_dependencies()
    if not ok:
        raise SystemExit(f"--engine coordinator: {why}")
    return CoordinatorEngine(
        model,
        tokenizer,  # the bench's CharTokenizer(generates_eod=False): a plain class, it pickles into the coordinator
        CoordinatorConfig(
            kv_cache_mode="persist",
            buffer_size_gb=args.buffer_gb,
            max_requests=shape.max_active_requests,
            num_cuda_graphs=args.cuda_graphs,
            cuda_graph_sizing=args.graph_sizing,
            ep_consensus_interval=getattr(args, "ep_consensus_interval", None),
        ),
        weight_version=weight_version,
        max_sequence_length=max_sequence_length,
    )


__all__ = ["coordinator_engine"]
