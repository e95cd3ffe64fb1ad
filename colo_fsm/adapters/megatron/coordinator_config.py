"""Settings of the coordinator-mode engine and what it needs from megatron-core's runtime.

:class:`CoordinatorConfig` (validated at construction), whether the coordinator's transport is installed, the
spawn/import-safety check, and the few places that reach into ``MegatronAsyncLLM``: its constructor, its
``InferenceClient`` (the only route to the generation epoch in megatron-core 0.19.2), its shutdown (awaited
from a loop of our own) and its coordinator process. Used by :mod:`colo_fsm.adapters.megatron.coordinator`.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from colo_fsm.adapters.batching import DEFAULT_SERVER_SHARE, check_share, parse_inflight, parse_logprobs_mode
from colo_fsm.adapters.engine.options import positive_int
from colo_fsm.adapters.megatron.engine_config import KVCacheMode
from colo_fsm.adapters.megatron.inference_settings import check_graph_sizing, megatron_inference_config
from colo_fsm.errors import ConfigError, WaitTimeout
from colo_fsm.guards.parallelism import read_parallel_size

MEGATRON_CONSENSUS_INTERVAL = 20
"""megatron-core 0.19.2's default ``InferenceConfig.ep_consensus_interval``: its loop's steps between two looks for
a pause while it has work."""

SPAWN_HINT = (
    "an import-safe entry script: megatron-core starts its inference coordinator with multiprocessing 'spawn', "
    'which re-imports the script that built the engine; put the run under `if __name__ == "__main__":`'
)


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of the coordinator-mode engine.

    ``kv_cache_mode``, ``buffer_size_gb``, ``max_requests``, ``block_size_tokens``, ``num_cuda_graphs`` (an upper
    bound) and ``cuda_graph_sizing`` ("exponential" or "linear", None: megatron's default; see
    :mod:`~colo_fsm.adapters.megatron.inference_settings`) go to megatron-core's ``InferenceConfig``; parallel
    sizes left at None inherit the training model's (set ones must match it); ``max_request_tokens`` bounds prompts x max_tokens of one ``generate_ids`` call;
    ``coordinator_host``/``coordinator_port`` are megatron's (None: its defaults); ``control_timeout_s`` bounds
    each pause/suspend/resume/unpause wait; ``watch_interval_s`` is how often the engine loop is checked;
    ``logprobs_mode`` ("raw": the untempered softmax, or "processed": after temperature, top-k, top-p) is
    megatron-core's ``InferenceConfig.logprobs_mode``, one for every request; ``server_share`` (in (0, 1]) bounds
    the share of ``max_requests`` that ``Priority.SERVER`` requests (HTTP traffic) hold in the engine at once
    (the rest wait in the adapter), so the trainer's rollouts keep the rest; ``inflight`` is what a suspend does
    with the requests in flight: "park" (alias "keep", default: megatron keeps them), "drain" (alias "wait": the
    suspend waits for their answers) or "abort" (ended, then resubmitted as prompt + tokens so far after the
    resume: :mod:`~colo_fsm.adapters.megatron.coordinator_inflight`).

    ``ep_consensus_interval`` is megatron's ``InferenceConfig.ep_consensus_interval``: while its loop has work, it
    checks whether every expert-parallel peer asked to pause only every this many iterations, so a pause lands up
    to that many decode steps after it was asked. None (the default) sets 1 where expert parallelism is 1 (the
    check is then local and costs nothing, and the pause lands at the next step) and leaves megatron's default
    (20) otherwise (there each check is an all-reduce over the expert-parallel group): see
    :meth:`consensus_interval`.
    """

    kv_cache_mode: str = "persist"
    buffer_size_gb: float = 1.0
    max_requests: int | None = None
    block_size_tokens: int = 256
    num_cuda_graphs: int | None = None
    cuda_graph_sizing: str | None = None
    max_request_tokens: int | None = None
    coordinator_host: str | None = None
    coordinator_port: int | None = None
    logprobs_mode: str = "raw"
    server_share: float = DEFAULT_SERVER_SHARE
    control_timeout_s: float = 600.0
    watch_interval_s: float = 0.05
    tensor_model_parallel_size: int | None = None
    pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int | None = None
    expert_tensor_parallel_size: int | None = None
    context_parallel_size: int | None = None
    inflight: str = "park"
    ep_consensus_interval: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inflight", parse_inflight(self.inflight).value)
        object.__setattr__(self, "kv_cache_mode", KVCacheMode(_kv_mode(self.kv_cache_mode)).value)
        object.__setattr__(self, "logprobs_mode", parse_logprobs_mode(self.logprobs_mode).value)
        object.__setattr__(self, "server_share", check_share(self.server_share))
        for name in ("buffer_size_gb", "control_timeout_s", "watch_interval_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or not math.isfinite(v):
                raise ConfigError(name, v, "a positive number")
        positive_int("block_size_tokens", self.block_size_tokens)
        for name in (
            "max_requests",
            "num_cuda_graphs",
            "max_request_tokens",
            "coordinator_port",
            "ep_consensus_interval",
        ):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), "a positive integer, or None")
        object.__setattr__(self, "cuda_graph_sizing", check_graph_sizing(self.cuda_graph_sizing, self.num_cuda_graphs))
        if self.coordinator_host is not None and (
            not isinstance(self.coordinator_host, str) or not self.coordinator_host
        ):
            raise ConfigError("coordinator_host", self.coordinator_host, "a host name or address, or None")
        for name in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "expert_model_parallel_size",
            "expert_tensor_parallel_size",
            "context_parallel_size",
        ):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), "a positive integer, or None (inherit the training model's)")
        if self.kv_cache_mode == "offload" and self.num_cuda_graphs is not None:
            # megatron-core 0.19.2 recaptures graphs at an offload resume and resets the context after the capture:
            # requests parked in the context would be lost (recompute re-adds them after the capture).
            raise ConfigError(
                "kv_cache_mode",
                self.kv_cache_mode,
                "'persist' or 'recompute' with num_cuda_graphs (an offload resume recaptures the graphs and resets "
                "the context, which drops the parked requests)",
            )

    def consensus_interval(self, expert_parallel_size: int) -> int | None:
        """The ``ep_consensus_interval`` megatron's loop gets at ``expert_parallel_size``: the one set, else 1 at
        expert parallelism 1, else None (megatron's default, :data:`MEGATRON_CONSENSUS_INTERVAL`)."""
        if self.ep_consensus_interval is not None:
            return self.ep_consensus_interval
        return 1 if expert_parallel_size == 1 else None

    @property
    def engine_max_requests(self) -> int:
        """The requests megatron's engine holds at once (``max_requests``, else 128)."""
        return self.max_requests if self.max_requests is not None else 128

    @property
    def max_top_logprobs(self) -> int:
        """Alternatives per token this engine records: none (the coordinator path returns no top-n ids here)."""
        return 0


def _kv_mode(value: Any) -> str:
    from colo_fsm.adapters.megatron.engine_config import parse_kv_cache_mode

    return parse_kv_cache_mode(value).value


def inference_config(config: CoordinatorConfig, max_sequence_length: int, *, expert_parallel_size: int) -> Any:
    """megatron-core's ``InferenceConfig`` of ``config`` (:func:`~colo_fsm.adapters.megatron.inference_settings.
    megatron_inference_config`, as the direct path builds it, with the loop's consensus interval at
    ``expert_parallel_size``: :meth:`CoordinatorConfig.consensus_interval`)."""
    return megatron_inference_config(
        block_size_tokens=config.block_size_tokens,
        buffer_size_gb=config.buffer_size_gb,
        max_requests=config.engine_max_requests,
        max_sequence_length=max_sequence_length,
        kv_cache_mode=config.kv_cache_mode,
        num_cuda_graphs=config.num_cuda_graphs,
        cuda_graph_sizing=config.cuda_graph_sizing,
        logprobs_mode=config.logprobs_mode,
        ep_consensus_interval=config.consensus_interval(expert_parallel_size),
    )


def expert_parallel_size(config: CoordinatorConfig, training_config: Any) -> int:
    """The expert parallelism megatron's engine will run at: the size of megatron's expert-parallel group where its
    model parallelism is initialized (the group the engine takes its consensus over, colo-fsm passing it no other),
    else the config's, else the training model's (1 where neither says)."""
    try:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            return int(parallel_state.get_expert_model_parallel_world_size())
    except ImportError:  # pragma: no cover - megatron-core is the extra this engine needs
        pass
    if config.expert_model_parallel_size is not None:
        return config.expert_model_parallel_size
    return read_parallel_size(training_config, "expert_model_parallel_size", "training_config") or 1


def coordinator_dependencies() -> tuple[bool, str]:
    """Whether pyzmq and msgpack (the coordinator's transport) are importable here, and if not, which is missing."""
    import importlib.util

    missing = [m for m, mod in (("pyzmq", "zmq"), ("msgpack", "msgpack")) if importlib.util.find_spec(mod) is None]
    if missing:
        return False, f"{' and '.join(missing)} not installed (pip install 'colo-fsm[coordinator]')"
    return True, "pyzmq and msgpack found"


def in_spawn_bootstrap() -> bool:
    """True inside a spawned child that is re-importing the parent's entry script (its ``__main__``)."""
    main = sys.modules.get("__main__")
    return getattr(main, "__name__", "__main__") == "__mp_main__"


def entry_script() -> str:
    """The path of the running entry script (``__main__``), for error messages."""
    main = sys.modules.get("__main__")
    return str(getattr(main, "__file__", "<interactive>"))


def megatron_async_llm(**kwargs: Any) -> Any:
    """megatron-core's ``MegatronAsyncLLM(**kwargs)`` (imported here, so nothing else imports it eagerly)."""
    from megatron.core.inference.apis import MegatronAsyncLLM

    return MegatronAsyncLLM(**kwargs)


def check_buildable(factory: Callable[..., Any]) -> None:
    """Refuse, before anything is built, where megatron's coordinator cannot start: inside a spawned child's
    re-import of the entry script, or (for megatron's own ``MegatronAsyncLLM``) without pyzmq and msgpack."""
    if in_spawn_bootstrap():
        raise ConfigError("__main__", entry_script(), SPAWN_HINT)
    ok, why = coordinator_dependencies()
    if not ok and factory is megatron_async_llm:
        raise ConfigError("coordinator", why, "pyzmq and msgpack importable (the 'coordinator' extra)")


def build_async_llm(factory: Callable[..., Any], config: CoordinatorConfig, **kwargs: Any) -> Any:
    """``factory(**kwargs)`` in coordinator mode, at ``config``'s coordinator host and port where set: megatron's
    engine, its loop and its coordinator process. A coordinator that exits during start-up (a spawned child
    re-running an entry script that is not import-safe, or a tokenizer it cannot unpickle) is a
    :class:`ConfigError` naming the entry script."""
    if config.coordinator_host is not None:
        kwargs["coordinator_host"] = config.coordinator_host
    if config.coordinator_port is not None:
        kwargs["coordinator_port"] = config.coordinator_port
    try:
        return factory(use_coordinator=True, **kwargs)
    except RuntimeError as exc:
        if "exited unexpectedly" in str(exc):
            raise ConfigError(
                "__main__",
                entry_script(),
                f"{SPAWN_HINT} (the coordinator process exited during start-up; its traceback is above it: "
                "the other usual cause is a tokenizer that cannot be pickled into the child)",
            ) from exc
        raise


def client_of(llm: Any) -> Any:
    """megatron's ``InferenceClient`` on the primary rank (None elsewhere).

    megatron-core 0.19.2 exposes the generation epoch only on the client (``set_generation_epoch``), which
    ``MegatronAsyncLLM`` keeps in its coordinator runtime; a version without it is refused by name.
    """
    runtime = getattr(llm, "_coord_runtime", None)
    if runtime is None or not hasattr(runtime, "client"):
        raise ConfigError(
            "megatron-core",
            type(llm).__name__,
            "a MegatronAsyncLLM with a coordinator runtime holding the InferenceClient (megatron-core 0.19.2)",
        )
    return runtime.client


def run_elsewhere(make: Callable[[], Coroutine[Any, Any, Any]], timeout_s: float) -> None:
    """Run ``make()`` to completion on a fresh event loop in a thread of its own (the caller may be inside a loop)."""
    box: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(asyncio.wait_for(make(), timeout_s))
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run, name="colo-fsm-coordinator-shutdown", daemon=True)
    t.start()
    t.join(timeout_s + 5)
    if t.is_alive():
        raise WaitTimeout("the coordinator engine's shutdown", timeout_s)
    if box:
        raise box[0]


def stop_process(proc: Any) -> None:
    """Terminate a child process still alive (megatron's coordinator after its engine loop died)."""
    if proc is not None and proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()


def global_rank() -> int:
    """This process's global rank (0 without ``torch.distributed``)."""
    try:
        import torch.distributed as dist

        return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0
    except ImportError:  # pragma: no cover - torch is a dependency of the megatron extra
        return 0


__all__ = [
    "MEGATRON_CONSENSUS_INTERVAL",
    "SPAWN_HINT",
    "CoordinatorConfig",
    "build_async_llm",
    "check_buildable",
    "client_of",
    "coordinator_dependencies",
    "entry_script",
    "expert_parallel_size",
    "global_rank",
    "in_spawn_bootstrap",
    "inference_config",
    "megatron_async_llm",
    "run_elsewhere",
    "stop_process",
]
