"""megatron-core's coordinator mode as the colocated engine (``GenerationEngine``, ``TextGenerator``, token engine).

:class:`CoordinatorEngine` builds ``MegatronAsyncLLM(model=..., use_coordinator=True)`` once: the dynamic
engine over the training model object, its loop in a background event loop, the ZMQ data-parallel coordinator
(a child process) and an ``InferenceClient`` on global rank 0. This is the path NeMo-RL's colocated
``MegatronGeneration`` and Megatron-LM's RL run, and the only one megatron-core allows with expert parallelism
(``MegatronLLM(use_coordinator=False)`` refuses ``expert_model_parallel_size > 1``).

The handoff is megatron's own (see :mod:`colo_fsm.adapters.megatron.coordinator_states`):

* ``suspend()``: pause -> wait PAUSED -> suspend -> wait SUSPENDED, then the shared model back to its training
  mode. Requests in flight stay in the engine (parked: KV kept in persist, re-prefilled in recompute).
* ``resume()``: decode-side model switches back, the generation epoch set to the lifecycle's weight version,
  resume -> wait RESUMED -> unpause -> wait RUNNING. The lifecycle drains this rank's device and meets the
  barrier before calling it (and after ``suspend()``), as for every engine.

``CoordinatorConfig.inflight`` picks what the suspend does with the requests in flight first: "park" (the above),
"drain" (wait for their answers) or "abort" (end them through megatron's stop-word hook, resubmit after the
resume): see :mod:`colo_fsm.adapters.megatron.coordinator_inflight`.

Each token's weight version comes from megatron's own ``policy_epoch`` stamps (checked against the epochs this
engine set). The engine loop is watched: if it ends (megatron turns an exception in its loop into
``sys.exit`` on the loop thread, so nothing else would ever answer), every pending request fails at once with
:class:`~colo_fsm.errors.EngineLoopDied` and every later call raises it. The lifecycle sees megatron's
``EngineState`` through :meth:`CoordinatorEngine.engine_state` and refuses a disagreement.

The coordinator is started with multiprocessing *spawn*, which re-imports the entry script: the script that
builds this engine must be import-safe (everything under ``if __name__ == "__main__":``). Needs the
``coordinator`` extra (pyzmq, msgpack) and a GPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from colo_fsm.adapters.batching import InflightPolicy, InflightStats, OnToken, Priority, RequestCounts, TokenCompletion
from colo_fsm.adapters.engine.options import share_slots
from colo_fsm.adapters.megatron.batch_calls import TextGeneration, submit_and_wait, timing_medians
from colo_fsm.adapters.megatron.coordinator_config import (
    MEGATRON_CONSENSUS_INTERVAL,
    SPAWN_HINT,
    CoordinatorConfig,
    build_async_llm,
    check_buildable,
    client_of,
    coordinator_dependencies,
    expert_parallel_size,
    global_rank,
    inference_config,
    megatron_async_llm,
    run_elsewhere,
    stop_process,
)
from colo_fsm.adapters.megatron.coordinator_inflight import EndedRequests, carry_over, end_running
from colo_fsm.adapters.megatron.coordinator_loop import call_on_loop, loop_death, pin_device, wait_until
from colo_fsm.adapters.megatron.coordinator_requests import (
    CoordinatorHandle,
    ServerShare,
    check_request,
    resolve,
    sampling_params,
    settle,
    state_name,
)
from colo_fsm.adapters.megatron.coordinator_states import SLEEP, WAKE, condition_of, natives_by_condition
from colo_fsm.adapters.megatron.memory import check_engine_budget
from colo_fsm.adapters.megatron.mode import mode_control
from colo_fsm.adapters.megatron.parallel import device_context
from colo_fsm.adapters.megatron.step_profile import LoopCheck, StepProfile, profile_async_steps
from colo_fsm.errors import (
    ConfigError,
    EngineLoopDied,
    EngineRebuild,
    EngineStopped,
    LifecycleError,
)
from colo_fsm.guards.engine_state import EngineStateReport
from colo_fsm.guards.memory import MemoryBudget, MemoryEstimate
from colo_fsm.guards.mode import ModeReport
from colo_fsm.guards.parallelism import check_parallelism
from colo_fsm.log import get_logger
from colo_fsm.states.spec import EngineCondition

log = get_logger(__name__)

ENGINE_NAME = "megatron-core"


class CoordinatorEngine(TextGeneration):
    """megatron-core's coordinator mode over the training model object (see the module docstring).

    ``weight_version`` (a callable, e.g. ``lambda: lifecycle.weight_version``) is set as megatron's generation
    epoch at bring-up and at every resume. ``llm_factory`` builds the engine (default: megatron-core's
    ``MegatronAsyncLLM``; tests pass a scripted stand-in with the same surface).
    """

    reads_weights_in_place = True
    backend_name = "coordinator"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: CoordinatorConfig | None = None,
        *,
        training_config: Any = None,
        max_sequence_length: int | None = None,
        weight_version: Callable[[], int] | None = None,
        server_urls: Sequence[str] = (),
        llm_factory: Callable[..., Any] | None = None,
        rank: int | None = None,
    ) -> None:
        if config is not None and not isinstance(config, CoordinatorConfig):
            raise ConfigError("config", config, "a CoordinatorConfig or None")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or CoordinatorConfig()
        self.training_config = training_config if training_config is not None else getattr(model, "config", None)
        self.parallelism = check_parallelism(self.training_config, self.config)
        self.device = next(model.parameters()).device
        self.max_sequence_length = int(max_sequence_length or getattr(model, "max_sequence_length", 0) or 0)
        if self.max_sequence_length < 2:
            raise ConfigError("max_sequence_length", max_sequence_length, "an integer >= 2 (or a model with one)")
        self.rank = global_rank() if rank is None else int(rank)
        self.is_primary = self.rank == 0
        self._weight_version = weight_version or (lambda: 0)
        self._urls = list(server_urls)
        self._factory = llm_factory or megatron_async_llm
        self._llm: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.built = False
        self.torn_down = False
        self._stopping = False
        self._dead: EngineLoopDied | None = None
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)  # notified whenever a reply was handled
        self._pending: dict[int, CoordinatorHandle] = {}
        self.inflight = InflightPolicy(self.config.inflight)
        self._ended: EndedRequests[CoordinatorHandle] = EndedRequests()  # abort-mode handoffs' book (under _lock)
        self._next_id = 0
        self._done_q: queue.SimpleQueue[tuple[CoordinatorHandle, concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._worker_stop = threading.Event()
        self.epochs_sent: list[int] = []
        self.timings: list[tuple[str, float]] = []  # ("suspend"|"resume", seconds), in order
        self.pause_steps: list[int] = []  # per suspend: megatron's steps between asking the pause and SUSPENDED
        self.consensus_interval: int | None = None  # megatron's ep_consensus_interval, set at bring_up
        self.transitions: list[tuple[str, str]] = []  # (call, EngineState after it), in order
        self.loop_device: int | None = None
        self.seeds_not_applied = 0
        self.cancelled_still_decoding = 0
        self.generate_calls = 0
        self.server_share = ServerShare(share_slots(self.config.server_share, self.config.engine_max_requests))
        self.mode = mode_control(model)  # guards: the shared model's inference-only switches
        self.memory_budget: MemoryBudget | None = None
        self.memory_estimate: MemoryEstimate | None = None
        self.profile: StepProfile | None = None  # megatron's loop's steps by kind and graph, once built
        self._loop_check: LoopCheck | None = None  # megatron's step count against the profile's

    # ------------------------------------------------------------------ GenerationEngine
    def bring_up(self) -> None:
        """Build megatron-core's engine, coordinator and client once; pin the loop's CUDA device; set epoch."""
        if self.built:
            raise EngineRebuild("CoordinatorEngine.bring_up called twice: the colocated engine is built once per run")
        check_buildable(self._factory)
        self.memory_estimate = check_engine_budget(self)  # guards: refuse an over-budget build with the numbers
        with device_context(self.device):
            self.mode.to_inference()  # guards: decode-side switches on (e.g. DDP param-gather hooks off) first
        self.model.eval()
        t0 = time.perf_counter()
        ep = expert_parallel_size(self.config, self.training_config)
        self.consensus_interval = self.config.consensus_interval(ep)  # a pause lands within this many steps
        with device_context(self.device):  # megatron's loop thread inherits the constructing thread's device
            llm = build_async_llm(
                self._factory,
                self.config,
                model=self.model,
                tokenizer=self.tokenizer,
                inference_config=inference_config(self.config, self.max_sequence_length, expert_parallel_size=ep),
            )
        self._llm = llm
        engine_ep = getattr(llm.engine, "ep_world_size", None)
        if isinstance(engine_ep, int) and engine_ep != ep:  # the interval stays: peers must take the consensus alike
            log.warning(
                "megatron's engine runs at expert parallelism %d where colo-fsm read %d: its loop checks for a pause "
                "every %s step(s) all the same (set CoordinatorConfig.ep_consensus_interval to choose)",
                engine_ep,
                ep,
                self._interval_words(),
            )
        if callable(getattr(llm.engine, "async_step", None)):  # megatron's loop steps through it (step_profile.py)
            self.profile = StepProfile()
            profile_async_steps(llm.engine, self.profile)
            self._loop_check = LoopCheck(self.steps)
        self._loop = llm.engine.engine_loop_task.get_loop()
        self.built = True
        self._worker = threading.Thread(target=self._work, name="colo-fsm-coordinator-watch", daemon=True)
        self._worker.start()
        self.loop_device = self._call(pin_device(self.device), "pin the engine loop's CUDA device")
        self._set_epoch(int(self._weight_version()))
        self.build_s = time.perf_counter() - t0
        log.info(
            "coordinator engine up in %.2f s: %s EngineState=%s, kv_cache_mode=%s, pause checked every %s loop "
            "step(s), loop device %s, rank %d%s",
            self.build_s,
            ENGINE_NAME,
            self.native_state(),
            self.config.kv_cache_mode,
            self._interval_words(),
            self.loop_device,
            self.rank,
            " (holds the InferenceClient)" if self.is_primary else "",
        )

    def suspend(self) -> None:
        """Park every request: pause -> PAUSED -> suspend -> SUSPENDED; then the model back to training mode."""
        llm = self._live("suspend")
        t0 = time.perf_counter()
        if self.native_state() == "RUNNING" and self.inflight is InflightPolicy.DRAIN:
            self._wait_answered(lambda: not any(h.in_engine for h in self._pending.values()), "drain")
        elif self.native_state() == "RUNNING" and self.inflight is InflightPolicy.ABORT:
            self._end_in_flight(llm)
        if self.native_state() != "SUSPENDED":
            before = self.steps
            for call, want in SLEEP:
                self._call(getattr(llm, call)(), f"{call} (to {want})")
                self.transitions.append((call, self.native_state()))
            suspended_at = self.steps  # SUSPENDED: megatron's loop holds still
            self.pause_steps.append(suspended_at - before)
            if self._loop_check is not None:
                self._loop_check.hold(suspended_at)
        with device_context(self.device):
            self.mode.to_training()  # guards: every rank back in the training mode, identically
        self.timings.append(("suspend", time.perf_counter() - t0))

    def resume(self) -> None:
        """Decode switches back, epoch = weight version, resume -> RESUMED -> unpause -> RUNNING."""
        llm = self._live("resume")
        if self.native_state() == "RUNNING":  # already awake: megatron would ignore RESUME and never answer
            return
        t0 = time.perf_counter()
        with device_context(self.device):
            self.mode.to_inference()  # guards: decode-side switches back on
        self._set_epoch(int(self._weight_version()))
        for call, want in WAKE:
            self._call(getattr(llm, call)(), f"{call} (to {want})")
            self.transitions.append((call, self.native_state()))
            if call == "resume" and self._loop_check is not None:  # resumed, not unpaused: the loop holds still
                self._loop_check.restart(self.steps)  # (megatron's count is 0 again where it recaptured its graphs)
        self._resubmit_ended()
        self.timings.append(("resume", time.perf_counter() - t0))

    def shutdown(self) -> None:
        """Stop megatron's engine and coordinator (only on the way to Stopped); requests left resolve "abort"."""
        if not self.built or self.torn_down:
            self.torn_down = True
            return
        self._stopping = True
        llm = self._llm
        try:
            if self._dead is None and self._loop is not None and self._loop.is_running():
                # shutdown() joins megatron's loop thread: await it from a loop of our own, never from that one
                run_elsewhere(lambda: llm.shutdown(), self.config.control_timeout_s)
            else:
                stop_process(getattr(llm.engine, "inference_coordinator_process", None))
        finally:
            self._abort_pending()
            self._worker_stop.set()
            with device_context(self.device):
                self.mode.to_training()
            self.torn_down = True

    def server_base_urls(self) -> Sequence[str]:
        """Base URLs of OpenAI-compatible servers over this engine (none unless given)."""
        return list(self._urls)

    def set_server_urls(self, urls: Sequence[str]) -> None:
        """Record the URLs of servers started over this engine (published by the lifecycle at start)."""
        self._urls = list(urls)

    # ------------------------------------------------------------------ state
    def native_state(self) -> str:
        """megatron-core's ``EngineState`` name now ("" before bring-up)."""
        return state_name(self._llm.engine.state) if self._llm is not None else ""

    def engine_state(self) -> EngineStateReport | None:
        """megatron's ``EngineState`` and its lifecycle condition (the lifecycle checks it at every action)."""
        if self._llm is None:
            return None
        native = self.native_state()
        cond = condition_of(native)
        if self._dead is not None:
            native, cond = f"{native} (engine loop ended)", EngineCondition.TORN_DOWN
        return EngineStateReport(native, cond, ENGINE_NAME, natives_by_condition())

    def model_mode(self) -> ModeReport:
        """The shared model's inference-only switches now, and their training values (guards)."""
        return self.mode.report()

    @property
    def awake(self) -> bool:
        """True while megatron's engine is RUNNING."""
        return self.native_state() == "RUNNING" and self._dead is None

    @property
    def steps(self) -> int:
        """megatron's own step count (its context's ``step_count``: its loop's steps and dummy forwards since it last
        captured its CUDA graphs, which a resume does in the recompute and offload modes; 0 before bring-up)."""
        if self._llm is None:
            return 0
        return int(getattr(getattr(self._llm.engine, "context", None), "step_count", 0) or 0)

    def request_counts(self) -> RequestCounts:
        """Requests this rank submitted and not answered yet: in megatron's engine (running while RUNNING, else
        parked), or queued here (waiting for a server slot, or ended by an abort-mode suspend and not resubmitted)."""
        with self._lock:
            n = sum(1 for h in self._pending.values() if h.in_engine)
            queued = len(self._pending) - n
        return RequestCounts(queued, n, 0) if self.native_state() == "RUNNING" else RequestCounts(queued, 0, n)

    def inflight_stats(self) -> InflightStats:
        """What ``inflight="abort"`` cost so far: requests ended at suspends, the KV tokens they held, and their
        re-admissions with the tokens those prefilled again (zeros under "park" and "drain")."""
        with self._lock:
            return self._ended.stats()

    def set_inflight(self, inflight: str) -> None:
        """Change what the next suspends do with the requests in flight ("park", "drain" or "abort"); only while
        no request is pending (:class:`~colo_fsm.errors.LifecycleError` otherwise)."""
        config = dataclasses.replace(self.config, inflight=inflight)  # validated as at construction
        with self._lock:
            if self._pending:
                raise LifecycleError(
                    f"coordinator engine set_inflight({config.inflight!r}) with {len(self._pending)} request(s) "
                    "pending: switch the policy while the engine is idle"
                )
            self.config = config
            self.inflight = InflightPolicy(config.inflight)

    def step_profile(self) -> dict[str, float] | None:
        """The sums per kind of step of megatron's own engine loop so far (:class:`~colo_fsm.adapters.megatron.
        step_profile.StepProfile`, each ``async_step`` timed in the loop); None before ``bring_up`` or where the
        engine has no ``async_step``. Steps megatron's loop counts that reach neither the profile nor its count of
        dummy forwards (the loop stepping some other way than through the engine object's ``async_step``) are
        logged once (:class:`~colo_fsm.adapters.megatron.step_profile.LoopCheck`)."""
        if self.profile is None:
            return None
        if self._loop_check is None:
            return self.profile.snapshot()
        return self._loop_check.read(lambda: self.steps, self.profile.snapshot)

    def timing_summary(self) -> dict[str, float]:
        """Median suspend and resume seconds so far."""
        return timing_medians(self.timings)

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
    ) -> CoordinatorHandle:
        """Send one request to megatron's coordinator; returns its handle (``future``, ``cancel()``).

        Token ids, log-probs and per-token weight versions arrive when the request finishes (megatron-core
        0.19.2 replies once per request); ``on_token`` is then called for each token in order (returning False
        ends the completion there, finish "stop"), as are ``stop_token_ids``. megatron-core schedules requests
        first come, first served and samples every request from one
        generator: a ``seed`` on a sampled request is logged and counted (``seeds_not_applied``), not applied;
        ``Priority.SERVER`` requests hold at most ``CoordinatorConfig.server_share`` of the engine (the rest wait).
        Only global rank 0 holds the client; ``top_logprobs`` must be 0; ``logprobs_mode`` (None: the engine's)
        must be the engine's own (``CoordinatorConfig.logprobs_mode``).
        """
        self._live("submit")
        if not self.is_primary:
            raise ConfigError(
                "rank", self.rank, "0: in coordinator mode only global rank 0 holds megatron-core's InferenceClient"
            )
        ids = check_request(
            prompt_ids,
            max_tokens=max_tokens,
            sampling=(temperature, top_p, top_k, seed),
            top_logprobs=top_logprobs,
            logprobs_mode=logprobs_mode,
            config=self.config,
            max_sequence_length=self.max_sequence_length,
        )
        if seed is not None and temperature > 0:
            self.seeds_not_applied += 1
            if self.seeds_not_applied == 1:
                log.warning(
                    "seed=%s not applied: megatron-core 0.19.2 samples every request from one generator "
                    "(counted in seeds_not_applied)",
                    seed,
                )
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            handle = CoordinatorHandle(
                rid,
                ids,
                on_token=on_token,
                stop_token_ids=frozenset(int(t) for t in stop_token_ids),
                admitted_version=int(self._weight_version()),
                max_tokens=max_tokens,
                sampling=(float(temperature), float(top_p), int(top_k)),
            )
            self._pending[rid] = handle
        handle.server = int(priority) == int(Priority.SERVER)
        self._admit(handle)
        return handle

    def _admit(self, handle: CoordinatorHandle) -> None:
        """Send ``handle``'s next attempt: HTTP traffic holds at most its share of the engine, the rest waits."""
        if handle.server:
            self.server_share.admit(lambda: self._send(handle))
        else:
            self._send(handle)

    def _send(self, handle: CoordinatorHandle) -> None:
        if handle.future.done():  # cancelled (or failed) while it waited for a server slot or a resubmission
            with self._lock:
                self._pending.pop(handle.request_id, None)
            if handle.server:
                self.server_share.release()
            return
        assert self._loop is not None
        temperature, top_p, top_k = handle.sampling
        sp = sampling_params(handle.tokens_left, temperature, top_p, top_k, int(self.tokenizer.eod))
        with self._lock:
            handle.in_engine = True
        fut = asyncio.run_coroutine_threadsafe(self._llm.generate(list(handle.attempt_prompt), sp), self._loop)

        def finished(f: concurrent.futures.Future[Any], h: CoordinatorHandle = handle) -> None:
            self._done_q.put((h, f))  # turned into a completion on the watch thread, off megatron's loop

        fut.add_done_callback(finished)

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
    ) -> list[TokenCompletion]:
        """Submit every prompt and wait for all (a suspend in between parks them; they finish after the resume)."""
        self._live("generate")
        self.generate_calls += 1
        return submit_and_wait(
            self.submit,
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
        )

    # ------------------------------------------------------------------ internals
    def _interval_words(self) -> str:
        n = self.consensus_interval
        return str(n) if n is not None else f"{MEGATRON_CONSENSUS_INTERVAL} (megatron's default)"

    async def _send_epoch(self, epoch: int) -> None:
        client = client_of(self._llm)
        if client is not None:  # primary rank only; every rank's engine receives it through the coordinator
            client.set_generation_epoch(epoch)

    def _set_epoch(self, epoch: int) -> None:
        self._call(self._send_epoch(epoch), f"set generation epoch {epoch}")
        self.epochs_sent.append(epoch)

    def _live(self, what: str) -> Any:
        if self._dead is not None:
            raise self._dead
        if self._llm is None or not self.built:
            raise LifecycleError(f"coordinator engine {what} before bring_up")
        if self.torn_down:
            raise EngineStopped(f"coordinator engine {what} after shutdown")
        dead = self._died()
        if dead is not None:
            raise dead
        return self._llm

    def _call(self, coro: Coroutine[Any, Any, Any], what: str) -> Any:
        """Run ``coro`` on megatron's loop and wait, checking the loop is alive; bounded by control_timeout_s."""
        assert self._loop is not None
        return call_on_loop(self._loop, coro, what, **self._watching())

    def _wait_answered(self, done: Callable[[], bool], what: str) -> None:
        """Wait until ``done()`` holds (read under the lock), watching megatron's loop; bounded by
        ``control_timeout_s``."""
        wait_until(self._answered, done, what, **self._watching())

    def _watching(self) -> dict[str, Any]:
        return {
            "timeout_s": self.config.control_timeout_s,
            "interval_s": self.config.watch_interval_s,
            "died": self._died,
            "state": self.native_state,
        }

    def _died(self) -> EngineLoopDied | None:
        """The end of megatron's engine loop, recorded once (every pending request failed then): the recorded
        :class:`EngineLoopDied`, or None while the loop runs (and while we shut it down, unless it ended before)."""
        if self._dead is None and self._llm is not None and not self._stopping:
            detail = loop_death(self._llm, self._loop)
            if detail is not None:
                self._on_death(detail)
        return self._dead

    def _on_death(self, detail: str) -> None:
        with self._lock:
            if self._dead is not None:
                return
            pending = list(self._pending.values())
            self._pending.clear()
            self._dead = EngineLoopDied(detail, pending=len(pending), state=self.native_state(), rank=self.rank)
        log.error("%s; failing %d pending request(s)", detail, len(pending))
        for h in pending:
            settle(h.future, exc=self._dead)

    def _abort_pending(self) -> None:
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for h in pending:
            h.cancel()

    def _work(self) -> None:
        """Completions are turned into TokenCompletions here (off megatron's loop); the loop is watched."""
        while not self._worker_stop.is_set():
            try:
                handle, fut = self._done_q.get(timeout=self.config.watch_interval_s)
            except queue.Empty:
                if self._died() is not None:
                    return
                continue
            self._finish(handle, fut)

    def _finish(self, handle: CoordinatorHandle, fut: concurrent.futures.Future[Any]) -> None:
        try:
            self._answer(handle, fut)
        finally:
            with self._answered:
                self._ended.replied(handle.request_id)
                self._answered.notify_all()

    def _answer(self, handle: CoordinatorHandle, fut: concurrent.futures.Future[Any]) -> None:
        eod = int(self.tokenizer.eod)
        with self._lock:
            ended = self._ended.ended(handle, fut, eod=eod)
            handle.in_engine = False
            if not ended:
                self._pending.pop(handle.request_id, None)
        if handle.server:
            self.server_share.release()
        if ended:
            self._carry(handle, fut.result())
        elif not resolve(handle, fut, eod=eod, detokenize=self.tokenizer.detokenize, sent=self.epochs_sent):
            self.cancelled_still_decoding += 1

    # ------------------------------------------------------------------ in-flight policy (coordinator_inflight)
    def _end_in_flight(self, llm: Any) -> None:
        """``inflight="abort"``: end the requests running in megatron's engine (its stop-word hook, at its next
        step) and wait for as many replies, which carry each one's tokens over to its resubmission. A request sent
        but still in megatron's queue is not ended (it holds no KV); if it takes one of those replies, a late
        ended reply is resubmitted when it comes (:meth:`_carry`)."""
        with self._lock:
            self._ended.start(h.request_id for h in self._pending.values() if h.in_engine)
            running = bool(self._ended.ending)
        ended = self._call(end_running(llm.engine), "end the requests in flight") if running else 0
        log.debug("abort-mode suspend: %d request(s) running in megatron's engine ended", ended)
        self._wait_answered(lambda: self._ended.all_replied(ended), "the replies of the requests ended at the suspend")

    def _carry(self, handle: CoordinatorHandle, record: Any) -> None:
        """An ended attempt: its tokens carried over, the request resubmitted after the resume (at once if its
        reply came after the resume)."""
        held = carry_over(
            handle.carry,
            record,
            prompt_len=len(handle.attempt_prompt),
            sent=self.epochs_sent,
            request_id=handle.request_id,
        )
        with self._lock:
            late = self._ended.hold(handle, held)
        if late:
            self._resubmit_ended()

    def _resubmit_ended(self) -> None:
        """After the resume: every request ended at the suspend goes to megatron again as prompt + its tokens so
        far, with the rest of its ``max_tokens``, re-prefilled under the new weights."""
        with self._lock:
            again = self._ended.release()
        for h in again:
            self._admit(h)


__all__ = [
    "SPAWN_HINT",
    "CoordinatorConfig",
    "CoordinatorEngine",
    "CoordinatorHandle",
    "coordinator_dependencies",
]
