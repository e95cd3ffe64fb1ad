"""The colocated generation engine over the training model object (``GenerationEngine`` + ``TextGenerator``).

Built once (:meth:`MegatronEngine.bring_up`), suspended for every training step and resumed after, torn down
only on the way to Stopped. Generation reads the trainer's parameters in place (``reads_weights_in_place``),
so after a training step the next generation uses the new weights with no copy.

Requests are continuous-batched (:class:`~colo_fsm.adapters.batching.ContinuousBatcher`): each
:meth:`MegatronEngine.submit` adds one request to the running engine and returns a handle with its own future;
one engine thread steps every active request together. A suspend parks the requests at a decode-step boundary
(``inflight="park"``, the default) or waits for the admitted ones (``inflight="drain"``); after the resume
they continue under the new weights, each token stamped with the weight version it was generated under.

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

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from colo_fsm.adapters.batching import (
    ContinuousBatcher,
    InflightPolicy,
    InflightStats,
    OnToken,
    Priority,
    RequestCounts,
    RequestHandle,
    TokenCompletion,
    parse_logprobs_mode,
    request_seed,
)
from colo_fsm.adapters.engine.options import share_slots
from colo_fsm.adapters.megatron.batch_calls import TextGeneration, submit_and_wait, timing_medians, to_completion
from colo_fsm.adapters.megatron.engine_config import GenerationConfig as GenerationConfig
from colo_fsm.adapters.megatron.engine_config import KVCacheMode as KVCacheMode
from colo_fsm.adapters.megatron.engine_config import parse_kv_cache_mode as parse_kv_cache_mode
from colo_fsm.adapters.megatron.memory import check_engine_budget
from colo_fsm.adapters.megatron.mode import mode_control
from colo_fsm.adapters.megatron.parallel import device_context, on_own_device
from colo_fsm.errors import ConfigError, EngineRebuild, EngineStopped, LifecycleError
from colo_fsm.guards.memory import MemoryBudget, MemoryEstimate
from colo_fsm.guards.mode import ModeReport
from colo_fsm.guards.parallelism import check_parallelism
from colo_fsm.guards.sampling import SamplingStream, data_parallel_rank
from colo_fsm.log import get_logger

log = get_logger(__name__)


class MegatronEngine(TextGeneration):
    """Colocated generation on the training model object (``GenerationEngine`` and ``TextGenerator``).

    ``weight_version`` (a callable, e.g. ``lambda: lifecycle.weight_version``) stamps every generated token.
    Every entry point, and the engine thread, runs with this rank's GPU (the model's device, else
    ``LOCAL_RANK``) as the current CUDA device (see :func:`~colo_fsm.adapters.megatron.parallel.device_context`).
    """

    reads_weights_in_place = True
    admits_by_turn = True  # submit(turn=...): the HTTP server numbers a request's choices (round-robin admission)
    batcher_class: Callable[..., ContinuousBatcher] = ContinuousBatcher  # the engine loop (tests swap mutants in)

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
        self.inflight = InflightPolicy(self.config.inflight)
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
        self._batcher: ContinuousBatcher | None = None
        self.built = False
        self.torn_down = False
        self.generate_calls = 0
        self.mode = mode_control(model)  # guards: the shared model's inference-only switches (megatron/mode.py)
        self.memory_budget: MemoryBudget | None = None  # guards: checked before bring_up builds (megatron/memory.py)
        self.memory_estimate: MemoryEstimate | None = None  # guards: the last budget estimate (breakdown())
        # guards: this replica's sampling stream (colo_fsm/guards/sampling.py), carried by the fingerprint
        self.sampling = SamplingStream(self.config.sampling_seed, data_parallel_rank(self.config.data_parallel_rank))

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

    def _megatron_max_requests(self) -> int:
        """``config.engine_max_requests``; when derived from ``max_active_requests``, rounded up to a multiple of
        the TP size (megatron-core asserts it divides ``max_requests``; a set ``max_requests`` goes as it is)."""
        n = self.config.engine_max_requests
        if self.config.max_requests is not None:
            return n
        tp = int(getattr(self.training_config, "tensor_model_parallel_size", 1) or 1)
        return -(-n // tp) * tp

    def _make_backend(self) -> Any:
        """Build the step backend (runs on the engine thread)."""
        if self.backend_name == "dynamic":
            from colo_fsm.adapters.megatron.dynamic import DynamicStepBackend

            return DynamicStepBackend(
                self.model,
                self.tokenizer,
                kv_cache_mode=self.kv_cache_mode.value,
                max_sequence_length=self.max_sequence_length,
                buffer_size_gb=self.config.buffer_size_gb,
                max_requests=self._megatron_max_requests(),
                block_size_tokens=self.config.block_size_tokens,
                num_cuda_graphs=self.config.num_cuda_graphs,
                cuda_graph_sizing=self.config.cuda_graph_sizing,
                logprobs_mode=self.config.logprobs_mode,
                sampling=self.sampling,
            )
        from colo_fsm.adapters.megatron.cpu_loop import CpuStepLoop

        return CpuStepLoop(
            self.model,
            eod=self.tokenizer.eod,
            pad=self.tokenizer.pad,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
            sampling=self.sampling,
        )

    @on_own_device
    def bring_up(self) -> None:
        """Build the engine once, start its engine thread and leave it awake (``InferenceMode`` set)."""
        if self.built:
            raise EngineRebuild("MegatronEngine.bring_up called twice: the colocated engine is built once per run")
        self.memory_estimate = check_engine_budget(self)  # guards: refuse an over-budget build with the numbers
        self.mode.to_inference()  # guards: decode-side switches on (e.g. DDP param-gather hooks off) before any decode
        self.model.eval()
        from colo_fsm.adapters.lockstep import tensor_parallel_lockstep

        # TP > 1: the TP group's ranks decode one schedule, planned by its leader (colo_fsm/adapters/lockstep.py)
        lockstep = (
            tensor_parallel_lockstep(self.device, max_active_requests=self.config.max_active_requests)
            if self.config.tp_lockstep
            else None
        )
        extra: dict[str, Any] = {"lockstep": lockstep} if lockstep is not None else {}
        batcher = self.batcher_class(
            self._make_backend,
            weight_version=self._weight_version,
            max_active_requests=self.config.max_active_requests,
            inflight=self.inflight,
            max_sequence_length=self.max_sequence_length,
            detokenize=self.tokenizer.detokenize,
            device_context=lambda: device_context(self.device),
            name=f"colo-fsm-engine-{self.backend_name}",
            **extra,
            max_top_logprobs=self.config.max_top_logprobs,
            server_share=self.config.server_share,
            logprobs_mode=self.config.logprobs_mode,
        )
        batcher.start()
        self._batcher = batcher
        self.built = True
        note = ""
        if self.backend_name != "dynamic":  # the CPU loop has no KV cache and captures no CUDA graph
            unused = ["kv_cache_mode"] + [
                name for name in ("num_cuda_graphs", "cuda_graph_sizing") if getattr(self.config, name) is not None
            ]
            named = unused[0] if len(unused) == 1 else f"{', '.join(unused[:-1])} and {unused[-1]}"
            note = (
                f" (no KV cache or CUDA graphs on this path: {named} {'has' if len(unused) == 1 else 'have'} no effect)"
            )
        log.info(
            "colocated engine up: backend=%s (%s), kv_cache_mode=%s%s, inflight=%s, max_active_requests=%d, "
            "same model object as the trainer",
            self.backend_name,
            self.backend_reason,
            self.kv_cache_mode.value,
            note,
            self.inflight.value,
            self.config.max_active_requests,
        )

    @on_own_device
    def suspend(self) -> None:
        """Stop decoding at a step boundary (park) or after the admitted requests (drain), then suspend.

        Parked requests stay in the engine; on return no decode step is in flight and ``InferenceMode`` is clear.
        """
        self._live("suspend").suspend()
        self.mode.to_training()  # guards: every rank back in the training mode, identically

    @on_own_device
    def resume(self) -> None:
        """Resume decoding (KV restored per mode; model in eval mode; ``InferenceMode`` set); parked requests go on."""
        self.mode.to_inference()  # guards: decode-side switches back on
        self._live("resume").resume()

    @on_own_device
    def shutdown(self) -> None:
        """Abort every request left (futures resolve "abort") and tear the engine down (only on the way to Stopped)."""
        if self._batcher is not None and not self.torn_down:
            self._batcher.shutdown()
            self.mode.to_training()  # guards
        self.torn_down = True

    def model_mode(self) -> ModeReport:
        """The shared model's inference-only switches now, and their training values (guards)."""
        return self.mode.report()

    def sampling_stream(self) -> SamplingStream:
        """The stream this replica's engine samples from (guards: the handoff fingerprint carries it)."""
        return self.sampling

    def server_base_urls(self) -> Sequence[str]:
        """Base URLs of OpenAI-compatible servers over this engine (none unless given)."""
        return list(self._urls)

    def set_server_urls(self, urls: Sequence[str]) -> None:
        """Record the URLs of servers started over this engine (published by the lifecycle at start)."""
        self._urls = list(urls)

    # ------------------------------------------------------------------ state
    @property
    def awake(self) -> bool:
        """True while the engine decodes (built, not suspended, not shut down)."""
        return self._batcher is not None and self._batcher.awake

    @property
    def decode_in_flight(self) -> bool:
        """True only while a decode step runs."""
        return self._batcher is not None and self._batcher.decode_in_flight

    @property
    def steps(self) -> int:
        """Decode steps run so far."""
        return self._batcher.steps if self._batcher is not None else 0

    @property
    def steps_while_suspended(self) -> int:
        """Decode steps that ran while the engine was suspended (must stay 0)."""
        return self._batcher.steps_while_suspended if self._batcher is not None else 0

    @property
    def timings(self) -> list[tuple[str, float]]:
        """("suspend"|"resume", seconds the backend took), in order."""
        return list(self._batcher.timings) if self._batcher is not None else []

    def inflight_stats(self) -> InflightStats:
        """What ``inflight="abort"`` cost so far: requests ended at suspends, the KV tokens they discarded, and the
        tokens their re-admissions prefilled again (zeros under "park" and "drain", and before ``bring_up``)."""
        return self._batcher.inflight_stats() if self._batcher is not None else InflightStats(0, 0, 0, 0)

    def step_profile(self) -> dict[str, float] | None:
        """The dynamic backend's sums per kind of decode step so far (:class:`~colo_fsm.adapters.megatron.
        step_profile.StepProfile`; :func:`~colo_fsm.adapters.megatron.step_profile.window` compares two); None
        on the CPU backend, which keeps none, and before ``bring_up``."""
        backend = self._batcher.backend if self._batcher is not None else None
        profile = getattr(backend, "profile", None)
        return profile.snapshot() if profile is not None else None

    def set_inflight(self, inflight: str) -> None:
        """Change what the next suspends do with admitted requests ("park", "drain" or "abort"); only while the
        engine holds no request (:class:`~colo_fsm.errors.LifecycleError` otherwise). The engine, its KV buffer
        and its CUDA graphs stay as they are: e.g. a benchmark compares the policies on one built engine."""
        config = dataclasses.replace(self.config, inflight=inflight)  # validated as at construction
        if self._batcher is not None:
            self._batcher.set_inflight(config.inflight)
        self.config = config
        self.inflight = InflightPolicy(config.inflight)

    def request_counts(self, priority: Priority | int | None = None) -> RequestCounts:
        """Requests queued for admission, running, and parked in a suspended engine (of ``priority`` if given)."""
        return self._batcher.counts(priority) if self._batcher is not None else RequestCounts(0, 0, 0)

    def request_counts_nowait(self, priority: Priority | int | None = None) -> RequestCounts:
        """:meth:`request_counts` read without the engine loop's lock (for ``/health`` and ``/metrics``)."""
        return self._batcher.counts_nowait(priority) if self._batcher is not None else RequestCounts(0, 0, 0)

    @property
    def server_slots(self) -> int:
        """The most ``Priority.SERVER`` requests active at once (``server_share`` of ``max_active_requests``)."""
        if self._batcher is not None:
            return self._batcher.server_slots
        return share_slots(self.config.server_share, self.config.max_active_requests)

    @property
    def feeds_tensor_parallel_group(self) -> bool:
        """True when a request submitted here with ``feed=True`` reaches the tensor-parallel group's other ranks
        (a lockstep carries it): this rank may run the group's one HTTP server. False before ``bring_up``."""
        lock = getattr(self._batcher, "_lockstep", None)
        return lock is not None and bool(lock.leader)

    def _live(self, what: str) -> ContinuousBatcher:
        if self._batcher is None or not self.built:
            raise LifecycleError(f"engine {what} before bring_up")
        if self.torn_down:
            raise EngineStopped(f"engine {what} after shutdown")
        return self._batcher

    # ------------------------------------------------------------------ generation
    def submit(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        priority: Priority | int = Priority.TRAINING,
        on_token: OnToken | None = None,
        top_logprobs: int = 0,
        logprobs_mode: str | None = None,
        feed: bool = False,
        turn: int = 0,
    ) -> RequestHandle:
        """Add one request to the running engine; returns its handle (future, cancel).

        ``turn``: the request's place among one caller's requests (the HTTP server numbers the ``n`` choices of a
        request 0, 1, ...); within a priority the queue is admitted by turn, then arrival.

        ``feed=True`` (the first rank of a tensor-parallel group, where the group's server runs): the request is
        submitted here only and the lockstep carries it to the group's other ranks. An HTTP request
        (``Priority.SERVER``) submitted on a follower without it is refused with
        :class:`~colo_fsm.errors.ConfigError`: it could never run there alone.

        ``on_token(token_id, logprob, weight_version)`` runs on the engine thread after each new token;
        returning False ends the request with finish "stop". ``top_logprobs=k`` (0 to
        ``GenerationConfig.max_top_logprobs``; else :class:`~colo_fsm.errors.ConfigError` naming the limit)
        records each token's k most likely alternatives (``TokenCompletion.top_logprobs``, untempered log-probs)
        and passes them to ``on_token`` as a fourth argument. May be called while suspended: the request waits
        queued and starts after the resume. Raises :class:`~colo_fsm.errors.EngineStopped` after shutdown,
        :class:`~colo_fsm.errors.RequestTooLarge` when prompt + ``max_tokens`` > ``max_sequence_length``.
        ``logprobs_mode`` (None: ``GenerationConfig.logprobs_mode``) picks the distribution of the returned
        log-probs ("raw" or "processed"; see :class:`GenerationConfig`).
        """
        self._check_logprobs_mode(logprobs_mode)
        batcher = self._live("submit")
        lock = getattr(batcher, "_lockstep", None)
        if lock is not None and not lock.leader and int(priority) == int(Priority.SERVER):
            raise ConfigError(
                "priority",
                Priority.SERVER,
                "TRAINING on a follower of a tensor-parallel group: HTTP requests enter on the group's first rank "
                "(its server) and reach the followers through the lockstep",
            )
        return batcher.submit(
            prompt_ids,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop_token_ids=stop_token_ids,
            priority=priority,
            on_token=on_token,
            top_logprobs=top_logprobs,
            logprobs_mode=logprobs_mode,
            feed=feed,
            turn=turn,
        )

    def _check_logprobs_mode(self, logprobs_mode: str | None) -> None:
        """Refuse a per-request ``logprobs_mode`` the backend cannot give (the dynamic engine has one mode)."""
        if logprobs_mode is None:
            return
        mode = parse_logprobs_mode(logprobs_mode).value
        if self.backend_name == "dynamic" and mode != self.config.logprobs_mode:
            raise ConfigError(
                "logprobs_mode",
                logprobs_mode,
                f"{self.config.logprobs_mode!r}: megatron-core's dynamic engine has one mode for every request "
                "(set GenerationConfig.logprobs_mode)",
            )

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: Sequence[int] = (),
        priority: Priority | int = Priority.TRAINING,
        top_logprobs: int = 0,
        logprobs_mode: str | None = None,
    ) -> list[TokenCompletion]:
        """Submit every prompt and wait for all; each result carries per-token log-probs and weight versions.

        Nothing is locked: other callers' requests decode in the same steps, and a suspend in between parks
        these requests (they finish after the resume). A seeded call gives each request its own derived seed.
        """
        batcher = self._live("generate")
        self._check_logprobs_mode(logprobs_mode)
        self.generate_calls += 1
        return submit_and_wait(
            batcher.submit,
            prompts,
            max_tokens=max_tokens,
            seed=seed,
            max_request_tokens=self.config.max_request_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_token_ids=stop_token_ids,
            priority=priority,
            top_logprobs=top_logprobs,
            logprobs_mode=logprobs_mode,
        )

    def timing_summary(self) -> dict[str, float]:
        """Median suspend and resume seconds so far."""
        return timing_medians(self.timings)


__all__ = [
    "GenerationConfig",
    "InflightPolicy",
    "KVCacheMode",
    "MegatronEngine",
    "Priority",
    "RequestCounts",
    "RequestHandle",
    "TokenCompletion",
    "parse_kv_cache_mode",
    "request_seed",
    "to_completion",
]
