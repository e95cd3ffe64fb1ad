"""The colocated generation engine over the training model object (``GenerationEngine`` + ``TextGenerator``).

Built once (:meth:`MegatronEngine.bring_up`), suspended for every training step and resumed after, torn down
only on the way to Stopped. Generation reads the trainer's parameters in place (``reads_weights_in_place``),
so after a training step the next generation uses the new weights with no copy.

Backends, chosen automatically and reported at start-up (one log line on ``colo_fsm.megatron``):

* ``dynamic``: megatron-core's ``DynamicInferenceEngine`` on a GPU with flash-attention
  (see :mod:`colo_fsm.adapters.megatron.dynamic` for what each KV-cache mode does to the KV buffer and to
  CUDA graphs);
* ``cpu``: a batched greedy/sampling loop over the same model (:mod:`colo_fsm.adapters.megatron.cpu_loop`);
  it keeps no KV cache, so the KV-cache mode has nothing to act on there.

megatron-core's process-wide ``InferenceMode`` flag is set while the engine is awake and cleared while it
is suspended, on both backends (the dynamic engine does it itself; the CPU path does the same explicitly),
and the trainer clears it again before any training forward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

from colo_fsm.adapters.megatron.cpu_loop import Generated, generate_tokens
from colo_fsm.adapters.megatron.memory import check_engine_budget
from colo_fsm.adapters.megatron.mode import mode_control
from colo_fsm.adapters.megatron.parallel import on_own_device
from colo_fsm.adapters.protocols import Completion
from colo_fsm.errors import ConfigError, EngineRebuild, LifecycleError
from colo_fsm.guards.memory import MemoryBudget, MemoryEstimate
from colo_fsm.guards.mode import ModeReport
from colo_fsm.guards.parallelism import check_parallelism
from colo_fsm.log import get_logger

log = get_logger("colo_fsm.megatron")


class KVCacheMode(StrEnum):
    """What suspend does to the KV cache (megatron-core's ``KVCacheManagementMode``)."""

    PERSIST = "persist"  # keep it on the GPU, same addresses: CUDA graphs stay valid
    OFFLOAD = "offload"  # copy to host on suspend, back on resume: graphs recaptured
    RECOMPUTE = "recompute"  # free on suspend, re-prefill on resume: graphs recaptured


def parse_kv_cache_mode(value: Any) -> KVCacheMode:
    """``value`` as a :class:`KVCacheMode`; anything else raises :class:`ConfigError` naming the choices."""
    try:
        return KVCacheMode(str(value.value if isinstance(value, StrEnum) else value).lower())
    except ValueError:
        raise ConfigError("kv_cache_mode", value, "one of 'persist', 'offload', 'recompute'") from None


_BACKENDS = ("auto", "dynamic", "cpu")


@dataclass(frozen=True)
class GenerationConfig:
    """Settings of the colocated engine.

    Parallel sizes left at None inherit the training model's; set ones must match it (TP/PP/EP/ETP raise
    :class:`~colo_fsm.errors.ParallelismMismatch`, CP warns) because a colocated engine cannot reshard.
    """

    kv_cache_mode: str = "persist"
    backend: str = "auto"
    buffer_size_gb: float = 1.0
    max_requests: int | None = None
    block_size_tokens: int = 256
    tensor_model_parallel_size: int | None = None
    pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int | None = None
    expert_tensor_parallel_size: int | None = None
    context_parallel_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_mode", parse_kv_cache_mode(self.kv_cache_mode).value)
        if self.backend not in _BACKENDS:
            raise ConfigError("backend", self.backend, f"one of {_BACKENDS}")
        if (
            isinstance(self.buffer_size_gb, bool)
            or not isinstance(self.buffer_size_gb, int | float)
            or self.buffer_size_gb <= 0
        ):
            raise ConfigError("buffer_size_gb", self.buffer_size_gb, "a positive number of GiB")
        if (
            isinstance(self.block_size_tokens, bool)
            or not isinstance(self.block_size_tokens, int)
            or self.block_size_tokens < 1
        ):
            raise ConfigError("block_size_tokens", self.block_size_tokens, "a positive integer")
        if self.max_requests is not None and (
            isinstance(self.max_requests, bool) or not isinstance(self.max_requests, int) or self.max_requests < 1
        ):
            raise ConfigError("max_requests", self.max_requests, "a positive integer, or None (engine default)")
        for name in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "expert_model_parallel_size",
            "expert_tensor_parallel_size",
            "context_parallel_size",
        ):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(name, v, "a positive integer, or None (inherit the training model's)")


@dataclass(frozen=True)
class TokenCompletion:
    """A generated continuation with its token log-probs and the weight version that produced it."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    weight_version: int
    finish_reason: str


class _CpuBackend:
    name = "cpu"

    def __init__(self, model: Any, tokenizer: Any, max_sequence_length: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_sequence_length = max_sequence_length
        self.device = next(model.parameters()).device

    def generate(
        self, prompts: Sequence[Sequence[int]], *, max_tokens: int, temperature: float, seed: int | None
    ) -> list[Generated]:
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(int(seed))
        return generate_tokens(
            self.model,
            prompts,
            max_tokens=max_tokens,
            temperature=temperature,
            eod=self.tokenizer.eod,
            pad=self.tokenizer.pad,
            max_sequence_length=self.max_sequence_length,
            generator=gen,
            device=self.device,
        )

    def suspend(self) -> float:
        from megatron.core.inference.utils import InferenceMode

        InferenceMode.unset_active()
        return 0.0

    def resume(self) -> float:
        from megatron.core.inference.utils import InferenceMode

        InferenceMode.set_active()
        return 0.0

    def shutdown(self) -> None:
        self.suspend()


class MegatronEngine:
    """Colocated generation on the training model object (``GenerationEngine`` and ``TextGenerator``).

    ``weight_version`` (a callable, e.g. ``lambda: lifecycle.weight_version``) stamps every completion.
    Every entry point runs with this rank's GPU (the model's device, else ``LOCAL_RANK``) as the current
    CUDA device, whatever thread calls it (see :func:`~colo_fsm.adapters.megatron.parallel.device_context`).
    """

    reads_weights_in_place = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: GenerationConfig | None = None,
        *,
        training_config: Any = None,
        max_sequence_length: int | None = None,
        weight_version: Callable[[], int] | None = None,
        server_urls: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or GenerationConfig()
        self.kv_cache_mode = KVCacheMode(self.config.kv_cache_mode)
        self.training_config = training_config if training_config is not None else getattr(model, "config", None)
        # A colocated engine inherits the training model's parallelism: refuse a generation setting it can't use.
        self.parallelism = check_parallelism(self.training_config, self.config)
        self.device = next(model.parameters()).device  # this rank's GPU (or the CPU): entry points run on it
        self.max_sequence_length = int(max_sequence_length or getattr(model, "max_sequence_length", 0) or 0)
        if self.max_sequence_length < 2:
            raise ConfigError("max_sequence_length", max_sequence_length, "an integer >= 2 (or a model with one)")
        self._weight_version = weight_version or (lambda: 0)
        self._urls = list(server_urls)
        self.backend_name, self.backend_reason = self._choose_backend()
        self._backend: Any = None
        self._lock = threading.Lock()  # one generate at a time; suspend waits for an in-flight generate
        self.awake = False
        self.built = False
        self.torn_down = False
        self.timings: list[tuple[str, float]] = []  # ("suspend"|"resume", seconds)
        self.generate_calls = 0
        self.mode = mode_control(model)  # guards: the shared model's inference-only switches (megatron/mode.py)
        self.memory_budget: MemoryBudget | None = None  # guards: checked before bring_up builds (megatron/memory.py)
        self.memory_estimate: MemoryEstimate | None = None  # guards: the last budget estimate (breakdown())

    # ------------------------------------------------------------------ GenerationEngine
    def _choose_backend(self) -> tuple[str, str]:
        from colo_fsm.adapters.megatron.dynamic import dynamic_engine_available

        on_cuda = next(self.model.parameters()).is_cuda
        ok, why = dynamic_engine_available()
        want = self.config.backend
        if want == "dynamic":
            if not (ok and on_cuda):
                raise ConfigError("backend", want, f"'cpu' or 'auto' here: {why if not ok else 'model is not on CUDA'}")
            return "dynamic", why
        if want == "cpu":
            return "cpu", "requested"
        if ok and on_cuda:
            return "dynamic", why
        return "cpu", why if not ok else "model is on the CPU"

    @on_own_device
    def bring_up(self) -> None:
        """Build the engine once and leave it awake (``InferenceMode`` set)."""
        if self.built:
            raise EngineRebuild("MegatronEngine.bring_up called twice: the colocated engine is built once per run")
        self.memory_estimate = check_engine_budget(self)  # guards: refuse an over-budget build with the numbers
        self.model.eval()
        if self.backend_name == "dynamic":
            from colo_fsm.adapters.megatron.dynamic import DynamicBackend

            self._backend = DynamicBackend(
                self.model,
                self.tokenizer,
                kv_cache_mode=self.kv_cache_mode.value,
                max_sequence_length=self.max_sequence_length,
                buffer_size_gb=self.config.buffer_size_gb,
                max_requests=self.config.max_requests,
                block_size_tokens=self.config.block_size_tokens,
            )
        else:
            self._backend = _CpuBackend(self.model, self.tokenizer, self.max_sequence_length)
            self._backend.resume()  # same flag semantics as the dynamic engine: set while awake
        self.built = True
        self.awake = True
        note = "" if self.backend_name == "dynamic" else " (no KV cache on this path: kv_cache_mode has no effect)"
        log.info(
            "colocated engine up: backend=%s (%s), kv_cache_mode=%s%s, same model object as the trainer",
            self.backend_name,
            self.backend_reason,
            self.kv_cache_mode.value,
            note,
        )

    @on_own_device
    def suspend(self) -> None:
        """Stop decoding: waits for an in-flight generate, then suspends (KV per mode; ``InferenceMode`` cleared)."""
        self._require_built("suspend")
        with self._lock:
            if not self.awake:
                return
            dt = self._backend.suspend()
            self.mode.to_training()  # guards: every rank back in the training mode, identically
            self.awake = False
            self.timings.append(("suspend", dt))

    @on_own_device
    def resume(self) -> None:
        """Resume decoding (KV restored per mode; model in eval mode; ``InferenceMode`` set)."""
        self._require_built("resume")
        with self._lock:
            if self.awake:
                return
            self.model.eval()
            self.mode.to_inference()  # guards: decode-side switches back on
            dt = self._backend.resume()
            self.awake = True
            self.timings.append(("resume", dt))

    @on_own_device
    def shutdown(self) -> None:
        """Tear the engine down (only on the way to Stopped)."""
        with self._lock:
            if self._backend is not None and not self.torn_down:
                self._backend.shutdown()
                self.mode.to_training()  # guards
            self._backend = None
            self.awake = False
            self.torn_down = True

    def model_mode(self) -> ModeReport:
        """The shared model's inference-only switches now, and their training values (guards)."""
        return self.mode.report()

    def server_base_urls(self) -> Sequence[str]:
        """Base URLs of OpenAI-compatible servers over this engine (none unless given)."""
        return list(self._urls)

    def set_server_urls(self, urls: Sequence[str]) -> None:
        """Record the URLs of servers started over this engine (published by the lifecycle at start)."""
        self._urls = list(urls)

    # ------------------------------------------------------------------ generation
    def _require_built(self, what: str) -> None:
        if not self.built or self.torn_down:
            raise LifecycleError(f"engine {what} before bring_up or after shutdown")

    @on_own_device
    def generate_ids(
        self, prompts: Sequence[Sequence[int]], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[TokenCompletion]:
        """Generate from token-id prompts; each result carries token log-probs and the weight version."""
        with self._lock:
            if not self.awake:
                raise LifecycleError(
                    "generate while the colocated engine is suspended (the caller must wait for resume)",
                    weight_version=self._weight_version(),
                )
            version = self._weight_version()
            self.generate_calls += 1
            outs = self._backend.generate(prompts, max_tokens=max_tokens, temperature=temperature, seed=seed)
        return [
            TokenCompletion(
                o.prompt_ids, o.token_ids, o.logprobs, self.tokenizer.detokenize(o.token_ids), version, o.finish_reason
            )
            for o in outs
        ]

    def generate(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        """Text in, text out (the ``TextGenerator`` protocol)."""
        ids = [self.tokenizer.tokenize(p) for p in prompts]
        return [
            Completion(
                text=c.text, token_ids=c.token_ids, weight_version=c.weight_version, finish_reason=c.finish_reason
            )
            for c in self.generate_ids(ids, max_tokens=max_tokens, temperature=temperature, seed=seed)
        ]

    def timing_summary(self) -> dict[str, float]:
        """Median suspend and resume seconds so far."""
        out: dict[str, float] = {}
        for kind in ("suspend", "resume"):
            xs = sorted(t for k, t in self.timings if k == kind)
            if xs:
                out[f"{kind}_median_s"] = xs[len(xs) // 2]
        return out


__all__ = ["GenerationConfig", "KVCacheMode", "MegatronEngine", "TokenCompletion", "parse_kv_cache_mode"]
