"""The per-rank colocated worker as a Ray actor, its control calls in their own concurrency group (the collector's
actor is :mod:`colo_fsm.ray.collector_actor`; both are built by :mod:`colo_fsm.ray.actor_class`).

A Ray asyncio actor runs at most ``max_concurrency`` calls at once (1000 by default); calls beyond that
queue in arrival order. If lifecycle control calls (pause, resume, suspend, shutdown) shared that queue
with rollout calls, a saturated actor would make every handoff wait for hundreds of rollouts. Each control
method here is declared in the ``"control"`` concurrency group, which has its own slots and its own event
loop, so it runs at once however many rollout calls are queued. Actors built with
``separate_control_group=False`` (to measure the difference, or to mimic an actor that cannot have groups)
keep everything in one queue; for those, size the collector's :class:`~colo_fsm.guards.capacity.InFlightCap`
with ``control_headroom`` so that rollouts never fill the actor.

A worker is colocated: its ``adapters_factory`` builds the engine *and* the trainer of its rank inside the
actor, on the same model object, so training steps, buffer offload/restore and checkpoint saves run in the
worker's own process, on the weights its engine generates from. Training calls are control calls too (a
training step must never queue behind rollout calls), and the worker refuses them while its engine's gate
is open, a rollout is being handed over or its engine is awake.

Over a request-level engine (one with ``submit()``, as :class:`~colo_fsm.adapters.megatron.MegatronEngine`
has) a worker parks, like the in-process path (:attr:`~colo_fsm.states.rules.LifecycleRule.PARK_NOT_DRAIN`):
a rollout call passes the gate only to *hand* its requests to the engine, then awaits its own futures; a
``suspend`` stops the engine at a decode-step boundary with those requests kept, and they finish after
``resume`` under the new weights (each token stamped with its weight version). ``inflight="drain"`` (or an
engine without ``submit()``) holds the gate for the whole call, so a suspend waits for the rollouts.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import inspect
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from colo_fsm.adapters.batching import request_seed
from colo_fsm.adapters.protocols import Completion, GenerationEngine, StepResult, TextGenerator, Trainer
from colo_fsm.collector.collector import parse_inflight
from colo_fsm.errors import ConfigError, LifecycleError
from colo_fsm.guards.capacity import RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY
from colo_fsm.guards.drain import default_drain, local_rank_from_env
from colo_fsm.log import get_logger
from colo_fsm.ray.actor_class import CONTROL_GROUP, actor_class
from colo_fsm.ray.collector_actor import (  # the collector's actor, here too for imports from this module
    COLLECTOR_CONTROL_METHODS,
    CollectorActor,
    CollectorBody,
    make_collector_class,
)
from colo_fsm.server.server import GatedEngine

log = get_logger(__name__)


WORKER_TRAINER_METHODS = ("train_step", "offload_buffers", "restore_buffers", "save_checkpoint")
"""Worker methods that run the rank's trainer (control group: a training step never queues behind rollouts)."""

WORKER_CONTROL_METHODS = (
    "bring_up",
    "suspend",
    "resume",
    "shutdown",
    "drain",
    *WORKER_TRAINER_METHODS,
    "info",
    "control_log",
    "health",
    "server_base_urls",
    "ping",
)
"""Every worker method that runs in the ``"control"`` concurrency group (all but ``generate``)."""


@dataclass(frozen=True)
class WorkerAdapters:
    """What a worker's ``adapters_factory`` returns: the rank's engine and trainer, built on one model object.

    ``generator`` (the ``TextGenerator`` rollouts and the HTTP server call) defaults to the engine itself when
    the engine has ``generate()`` (as :class:`~colo_fsm.adapters.megatron.MegatronEngine` does).
    ``trainer`` may be None for a generation-only worker; the trainer proxy then refuses it.
    """

    engine: GenerationEngine
    trainer: Trainer | None = None
    generator: TextGenerator | None = None


WorkerFactory = Callable[[int], WorkerAdapters | tuple[GenerationEngine, TextGenerator]]
"""``rank -> WorkerAdapters`` (or, generation only, ``rank -> (engine, generator)``), called inside the worker
actor, so the model, engine and trainer are built in the process (and on the device) where they run."""


class ColocatedFactory:
    """A picklable ``adapters_factory`` that builds one model and puts engine and trainer on that same object.

    ``build_model(rank)`` runs first, inside the worker; then ``make_engine(model, rank)``, then
    ``make_trainer(model, rank)`` (and ``make_generator(engine, rank)`` when the engine does not generate
    text itself). All four must be picklable (module-level functions or instances of module-level classes).
    """

    def __init__(
        self,
        build_model: Callable[[int], Any],
        make_engine: Callable[[Any, int], GenerationEngine],
        make_trainer: Callable[[Any, int], Trainer],
        make_generator: Callable[[GenerationEngine, int], TextGenerator] | None = None,
    ) -> None:
        for name, fn in (("build_model", build_model), ("make_engine", make_engine), ("make_trainer", make_trainer)):
            if not callable(fn):
                raise ConfigError(name, fn, "a callable")
        if make_generator is not None and not callable(make_generator):
            raise ConfigError("make_generator", make_generator, "a callable (engine, rank) -> TextGenerator, or None")
        self.build_model = build_model
        self.make_engine = make_engine
        self.make_trainer = make_trainer
        self.make_generator = make_generator

    def __call__(self, rank: int) -> WorkerAdapters:
        """Build the rank's model, then its engine and trainer on that model."""
        model = self.build_model(rank)
        engine = self.make_engine(model, rank)
        trainer = self.make_trainer(model, rank)
        generator = self.make_generator(engine, rank) if self.make_generator is not None else None
        return WorkerAdapters(engine, trainer, generator)


def _resolve_adapters(built: Any) -> WorkerAdapters:
    """Normalize a factory's result (``WorkerAdapters`` or a legacy ``(engine, generator)`` pair) and check it."""
    if isinstance(built, tuple) and len(built) == 2:
        built = WorkerAdapters(built[0], None, built[1])
    if not isinstance(built, WorkerAdapters):
        raise ConfigError(
            "adapters_factory", type(built).__name__, "a callable returning WorkerAdapters or (engine, generator)"
        )
    generator = built.generator
    if generator is None:
        if not callable(getattr(built.engine, "generate", None)):
            raise ConfigError(
                "adapters_factory",
                type(built.engine).__name__,
                "WorkerAdapters with a generator, or an engine that has generate()",
            )
        generator = built.engine  # type: ignore[assignment]
    trainer = built.trainer
    if trainer is not None:
        missing = [m for m in WORKER_TRAINER_METHODS if not callable(getattr(trainer, m, None))]
        if missing:
            raise ConfigError("trainer", type(trainer).__name__, f"a Trainer (missing {', '.join(missing)})")
        engine_model, trainer_model = getattr(built.engine, "model", None), getattr(trainer, "model", None)
        if engine_model is not None and trainer_model is not None and engine_model is not trainer_model:
            raise ConfigError(
                "adapters_factory",
                f"{type(built.engine).__name__}.model is not {type(trainer).__name__}.model",
                "engine and trainer built on the same model object (colocated)",
            )
    return WorkerAdapters(built.engine, trainer, generator)


class RolloutWorkerBody:
    """What a per-rank worker actor does: owns the rank's colocated engine (behind a suspend gate) and trainer.

    ``generate`` is the rollout path (default concurrency group). The control methods suspend/resume the
    engine through the gate, drain the rank's own device, run the rank's trainer (``train_step``,
    ``offload_buffers``, ``restore_buffers``, ``save_checkpoint``; one at a time, and only while the engine is
    suspended with no rollout being handed over), and report info, health and a log of control calls.
    ``inflight`` is ``"park"`` (a suspend parks the rollouts' requests in a request-level engine; they finish
    after the resume), ``"abort"`` (the engine ends them at the suspend and resubmits them after the resume: for
    the gate the same as park) or ``"drain"`` (a suspend waits for them); aliases "keep" and "wait"; None takes
    the engine's own ``inflight`` (default park). ``adapters_factory(rank)`` is called here, inside the actor; ``local_rank`` defaults to
    ``LOCAL_RANK`` (a malformed value raises :class:`~colo_fsm.errors.ConfigError`).
    """

    LOG_LIMIT = 4096
    """How many control calls :meth:`control_log` remembers."""

    def __init__(
        self,
        rank: int,
        adapters_factory: WorkerFactory,
        *,
        serve: bool = False,
        request_timeout_s: float = 300.0,
        drain_timeout_s: float = 300.0,
        threads: int = 32,
        local_rank: int | None = None,
        inflight: str | None = None,
        **server_kwargs: Any,
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError("rank", rank, "a non-negative integer")
        if not callable(adapters_factory):
            raise ConfigError("adapters_factory", adapters_factory, "a callable rank -> WorkerAdapters")
        self._local_rank = local_rank if local_rank is not None else local_rank_from_env()
        # the worker's own GPU (cuda:local_rank); an explicit no-op drain on a worker that sees no CUDA device
        self._drain = default_drain(self._local_rank)
        adapters = _resolve_adapters(adapters_factory(rank))
        generator = adapters.generator
        assert generator is not None  # _resolve_adapters fills it in
        self.rank = rank
        self.trainer = adapters.trainer
        self._train_lock = threading.Lock()  # one trainer call at a time on this rank
        self._log: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.LOG_LIMIT)
        self._train_steps = 0
        self._saves = 0
        if inflight is None:
            inflight = str(getattr(getattr(adapters.engine, "inflight", None), "value", None) or "park")
        inflight = parse_inflight(inflight)  # ConfigError naming the field and the choices
        self.inflight = inflight
        self.gated = GatedEngine(
            adapters.engine,
            generator,
            serve=serve,
            request_timeout_s=request_timeout_s,
            drain_timeout_s=drain_timeout_s,
            inflight=inflight,  # the gate holds requests only to drain them; park/abort must match the engine
            **server_kwargs,
        )
        submit = getattr(generator, "submit", None)
        self._submit = submit if callable(submit) and self.gated.tokenizer is not None else None
        self._agenerate = getattr(generator, "agenerate", None)
        if not inspect.iscoroutinefunction(self._agenerate):
            self._agenerate = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"rank{rank}-gen")
        self._active = 0
        self._max_active = 0
        self._calls = 0
        self._completed = 0
        self._requests = 0  # engine requests handed over by rollout calls
        self._answered = 0  # of those, resolved (any finish reason)

    # ------------------------------------------------------------------ rollout path
    async def generate(
        self, prompts: Sequence[str], max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        """Generate one completion per prompt on this rank (waits while the engine is suspended).

        Over a request-level engine with ``inflight="park"`` only the hand-over holds the gate: a suspend
        arriving later parks these requests and they are answered after the resume. A seeded call gives
        prompt ``i`` the seed ``request_seed(seed, i)`` (as ``MegatronEngine.generate`` does).
        """
        self._calls += 1
        try:
            if self._submit is not None:
                return await self._generate_requests(list(prompts), max_tokens, temperature, seed)
            async with self.gated.gate.admit_async(self.gated.request_timeout_s):
                self._active += 1
                self._max_active = max(self._max_active, self._active)
                try:
                    if self._agenerate is not None:
                        return list(
                            await self._agenerate(
                                list(prompts), max_tokens=max_tokens, temperature=temperature, seed=seed
                            )
                        )
                    loop = asyncio.get_running_loop()
                    gen = self.gated.generator
                    return list(
                        await loop.run_in_executor(
                            self._pool,
                            lambda: gen.generate(
                                list(prompts), max_tokens=max_tokens, temperature=temperature, seed=seed
                            ),
                        )
                    )
                finally:
                    self._active -= 1
        finally:
            self._completed += 1

    async def _generate_requests(
        self, prompts: list[str], max_tokens: int, temperature: float, seed: int | None
    ) -> list[Completion]:
        """Hand every prompt to the engine behind the gate, leave the gate (park), await the futures."""
        tok = self.gated.tokenizer
        submit = self._submit
        assert submit is not None and tok is not None
        ids = [tok.tokenize(p) for p in prompts]
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.gated.gate.admit_async(self.gated.request_timeout_s))
            handles: list[Any] = []
            try:
                for i, p in enumerate(ids):
                    handles.append(
                        submit(p, max_tokens=max_tokens, temperature=temperature, seed=request_seed(seed, i))
                    )
            except BaseException:
                for h in handles:  # a bad prompt in the list: withdraw the ones already handed over
                    h.cancel()
                raise
            self._requests += len(handles)
            if self.inflight != "drain":
                await stack.aclose()  # handed over: a suspend may come now and parks these requests
            self._active += 1
            self._max_active = max(self._max_active, self._active)
            try:
                outs = await asyncio.gather(*(h.wait() for h in handles))
            except BaseException:
                for h in handles:  # cancelled (ray.cancel) or failed: free the others' engine slots
                    h.cancel()
                raise
            finally:
                self._active -= 1
                self._answered += sum(1 for h in handles if h.done())
        return [_completion(o) for o in outs]

    # ------------------------------------------------------------------ control (own concurrency group)
    async def _logged(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in a thread and record the call (wall-clock start and end) in the control log."""
        entry: dict[str, Any] = {"call": name, "start": time.time(), "end": None, "ok": False}
        self._log.append(entry)
        try:
            result = await asyncio.to_thread(fn, *args)
            entry["ok"] = True
            return result
        finally:
            entry["end"] = time.time()

    async def bring_up(self) -> list[str]:
        """Build the engine (and its server, once); returns this rank's base URLs."""
        await self._logged("bring_up", self.gated.bring_up)
        return list(self.gated.server_base_urls())

    async def suspend(self) -> float:
        """Close the gate, suspend the engine; returns seconds taken.

        ``park``: the engine stops at a decode-step boundary and the rollouts' requests stay parked in it;
        ``drain`` (or an engine without ``submit()``): in-flight rollouts finish first."""
        t0 = time.monotonic()
        await self._logged("suspend", self.gated.suspend)
        return time.monotonic() - t0

    async def resume(self) -> None:
        """Resume the engine, then open the gate (after any running trainer call on this rank has returned)."""
        await self._logged("resume", self._resume)

    def _resume(self) -> None:
        with self._train_lock:
            self.gated.resume()

    async def shutdown(self) -> None:
        """Tear the engine (and server) down."""
        await self._logged("shutdown", self.gated.shutdown)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def drain(self) -> int:
        """Synchronize this rank's own device (by LOCAL_RANK, never the thread's current device)."""
        return int(await self._logged("drain", self._drain))

    # ------------------------------------------------------------------ trainer (control group too)
    def _trainer_call(self, name: str, *args: Any) -> Any:
        """Run one trainer method in this process, refusing while the engine could be generating."""
        if self.trainer is None:
            raise ConfigError(
                "trainer", None, f"a trainer on worker rank {self.rank} (WorkerAdapters.trainer from adapters_factory)"
            )
        with self._train_lock:
            gate = self.gated.gate
            inner = self.gated.inner
            awake = bool(getattr(inner, "awake", False)) or bool(getattr(inner, "decode_in_flight", False))
            if gate.is_open or gate.in_flight or awake:
                raise LifecycleError(
                    f"{name} on worker rank {self.rank} while its engine is not suspended (gate "
                    f"{'open' if gate.is_open else 'closed'}, {gate.in_flight} rollout(s) in flight, engine "
                    f"{'awake' if awake else 'suspended'}): decode and training must never overlap on a rank",
                    rank=self.rank,
                )
            return getattr(self.trainer, name)(*args)

    async def train_step(self, batch: Any) -> StepResult:
        """Run this rank's training step on ``batch`` (its shard); returns the trainer's ``StepResult``."""
        result = await self._logged("train_step", self._trainer_call, "train_step", batch)
        self._train_steps += 1
        return result if isinstance(result, StepResult) else StepResult()

    async def offload_buffers(self) -> None:
        """Free this rank's training-only memory (before the engine resumes)."""
        await self._logged("offload_buffers", self._trainer_call, "offload_buffers")

    async def restore_buffers(self) -> None:
        """Bring this rank's training-only memory back (before its training step)."""
        await self._logged("restore_buffers", self._trainer_call, "restore_buffers")

    async def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        """Write this rank's part of the checkpoint (the trainer runs the checkpoint collectives)."""
        await self._logged(
            "save_checkpoint", self._trainer_call, "save_checkpoint", step, weight_version, dict(extra_state)
        )
        self._saves += 1

    # ------------------------------------------------------------------ introspection (control group)
    async def info(self) -> dict[str, Any]:
        """Rank, local rank, process id, ``reads_weights_in_place`` of the engine, and whether it has a trainer."""
        return {
            "rank": self.rank,
            "local_rank": self._local_rank,
            "pid": os.getpid(),
            "engine": type(self.gated.inner).__name__,
            "reads_weights_in_place": bool(getattr(self.gated.inner, "reads_weights_in_place", False)),
            "trainer": type(self.trainer).__name__ if self.trainer is not None else None,
        }

    async def control_log(self) -> list[dict[str, Any]]:
        """The last :attr:`LOG_LIMIT` lifecycle calls on this worker, in order: ``{"call", "start", "end", "ok"}``
        (``time.time()`` seconds; ``end`` is None while running)."""
        return [dict(e) for e in self._log]

    async def server_base_urls(self) -> list[str]:
        """This rank's server base URLs."""
        return list(self.gated.server_base_urls())

    async def health(self) -> dict[str, Any]:
        """Rank, gate state, rollouts running now (and the most at once), ``generate`` calls received and
        returned (``completed``, successful or not), trainer steps and saves, the gate's counters, the inflight
        policy, engine requests handed over and answered, and, over a request-level engine, its request counts
        (``queued``/``running``/``parked``), ``engine_steps`` and ``steps_while_suspended`` (must stay 0)."""
        out: dict[str, Any] = {
            "rank": self.rank,
            "gate": self.gated.gate.state(),
            "active": self._active,
            "max_active": self._max_active,
            "calls": self._calls,
            "completed": self._completed,
            "train_steps": self._train_steps,
            "saves": self._saves,
            **self.gated.gate.counters(),
            "inflight": self.inflight,
            "requests": self._requests,
            "answered": self._answered,
        }
        inner = self.gated.inner
        counts = getattr(inner, "request_counts", None)
        if callable(counts):
            q, r, p = counts()
            out.update(queued=int(q), running=int(r), parked=int(p))
        for key, attr in (("engine_steps", "steps"), ("steps_while_suspended", "steps_while_suspended")):
            v = getattr(inner, attr, None)
            if isinstance(v, int) and not isinstance(v, bool):
                out[key] = v
        return out

    async def ping(self) -> float:
        """The actor's clock; the cheapest control call (for latency measurements)."""
        return time.time()


def _completion(o: Any) -> Completion:
    """The text-protocol :class:`Completion` of an engine's ``TokenCompletion`` (versions and log-probs kept)."""
    return Completion(
        text=o.text,
        token_ids=tuple(o.token_ids),
        weight_version=int(o.weight_version),
        finish_reason=o.finish_reason,
        weight_versions=tuple(int(v) for v in o.weight_versions),
        logprobs=tuple(float(x) for x in o.logprobs),
    )


def rank_local(rank: int | None = None) -> int:
    """The local rank of a worker: ``LOCAL_RANK`` in its environment when set, else 0 (one device per actor).

    A malformed ``LOCAL_RANK`` raises :class:`~colo_fsm.errors.ConfigError` (it would otherwise drain the
    wrong device). ``rank`` is ignored (kept for compatibility).
    """
    return local_rank_from_env()


def make_worker_class(
    *,
    separate_control_group: bool = True,
    control_concurrency: int = 8,
    max_concurrency: int = RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY,
) -> Any:
    """The Ray actor class of a colocated worker (``.remote(rank, adapters_factory, ...)`` creates one).

    Control methods (:data:`WORKER_CONTROL_METHODS`, training calls included) go to their own ``"control"``
    group (``control_concurrency`` slots) unless ``separate_control_group=False``; ``generate`` runs in the
    default group (``max_concurrency`` slots).
    """
    name = "RolloutWorker" if separate_control_group else "RolloutWorkerOneQueue"
    return actor_class(
        RolloutWorkerBody,
        WORKER_CONTROL_METHODS,
        name,
        separate_control_group=separate_control_group,
        control_concurrency=control_concurrency,
        max_concurrency=max_concurrency,
        module=__name__,
    )


RolloutWorker = make_worker_class()
"""Colocated worker actor class (engine + trainer of one rank) with control calls in their own concurrency group."""

__all__ = [
    "COLLECTOR_CONTROL_METHODS",
    "CONTROL_GROUP",
    "WORKER_CONTROL_METHODS",
    "WORKER_TRAINER_METHODS",
    "CollectorActor",
    "CollectorBody",
    "ColocatedFactory",
    "RolloutWorker",
    "RolloutWorkerBody",
    "WorkerAdapters",
    "WorkerFactory",
    "make_collector_class",
    "make_worker_class",
    "rank_local",
]
