"""Ray actors: per-rank rollout workers and the collector, with control calls in their own concurrency group.

A Ray asyncio actor runs at most ``max_concurrency`` calls at once (1000 by default); calls beyond that
queue in arrival order. If lifecycle control calls (pause, resume, suspend, shutdown) shared that queue
with rollout calls, a saturated actor would make every handoff wait for hundreds of rollouts. Each control
method here is declared in the ``"control"`` concurrency group, which has its own slots and its own event
loop, so it runs at once however many rollout calls are queued. Actors built with
``separate_control_group=False`` (to measure the difference, or to mimic an actor that cannot have groups)
keep everything in one queue; for those, size the collector's :class:`~colo_fsm.guards.capacity.InFlightCap`
with ``control_headroom`` so that rollouts never fill the actor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ray

from colo_fsm.adapters.protocols import Completion, GenerationEngine, TextGenerator
from colo_fsm.collector.buffer import ReplayBuffer, TrajectoryGroup
from colo_fsm.collector.collector import AsyncCollector, Prompt
from colo_fsm.errors import ConfigError
from colo_fsm.guards.capacity import RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY, InFlightCap
from colo_fsm.guards.drain import DeviceDrain
from colo_fsm.server.server import GatedEngine

log = logging.getLogger("colo_fsm.ray")

CONTROL_GROUP = "control"
"""Name of the concurrency group lifecycle control calls run in."""

WORKER_CONTROL_METHODS = ("bring_up", "suspend", "resume", "shutdown", "drain", "health", "server_base_urls", "ping")
COLLECTOR_CONTROL_METHODS = ("pause", "resume", "stats", "close", "state_dict", "load_state_dict", "ping")

WorkerFactory = Callable[[int], tuple[GenerationEngine, TextGenerator]]
"""``rank -> (engine, generator)``, called inside the worker actor (so the engine is built where it runs)."""


class RolloutWorkerBody:
    """What a per-rank worker actor does: owns one colocated engine (behind a suspend gate) on its rank.

    ``generate`` is the rollout path (default concurrency group). The control methods suspend/resume the
    engine through the gate (in-flight rollouts finish first), drain the rank's own device, and report health.
    """

    def __init__(
        self,
        rank: int,
        factory: WorkerFactory,
        *,
        serve: bool = False,
        request_timeout_s: float = 300.0,
        drain_timeout_s: float = 300.0,
        threads: int = 32,
        local_rank: int | None = None,
        **server_kwargs: Any,
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError("rank", rank, "a non-negative integer")
        engine, generator = factory(rank)
        self.rank = rank
        self.gated = GatedEngine(
            engine,
            generator,
            serve=serve,
            request_timeout_s=request_timeout_s,
            drain_timeout_s=drain_timeout_s,
            **server_kwargs,
        )
        self._agenerate = getattr(generator, "agenerate", None)
        if not inspect.iscoroutinefunction(self._agenerate):
            self._agenerate = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"rank{rank}-gen")
        self._drain = DeviceDrain(local_rank if local_rank is not None else rank_local(rank))
        self._active = 0
        self._max_active = 0
        self._calls = 0

    # ------------------------------------------------------------------ rollout path
    async def generate(
        self, prompts: Sequence[str], max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        """Generate one completion per prompt on this rank (waits while the engine is suspended)."""
        self._calls += 1
        async with self.gated.gate.admit_async(self.gated.request_timeout_s):
            self._active += 1
            self._max_active = max(self._max_active, self._active)
            try:
                if self._agenerate is not None:
                    return list(
                        await self._agenerate(list(prompts), max_tokens=max_tokens, temperature=temperature, seed=seed)
                    )
                loop = asyncio.get_running_loop()
                gen = self.gated.generator
                return list(
                    await loop.run_in_executor(
                        self._pool,
                        lambda: gen.generate(list(prompts), max_tokens=max_tokens, temperature=temperature, seed=seed),
                    )
                )
            finally:
                self._active -= 1

    # ------------------------------------------------------------------ control (own concurrency group)
    async def bring_up(self) -> list[str]:
        """Build the engine (and its server, once); returns this rank's base URLs."""
        await asyncio.to_thread(self.gated.bring_up)
        return list(self.gated.server_base_urls())

    async def suspend(self) -> float:
        """Close the gate, let in-flight rollouts finish, suspend the engine; returns seconds taken."""
        t0 = time.monotonic()
        await asyncio.to_thread(self.gated.suspend)
        return time.monotonic() - t0

    async def resume(self) -> None:
        """Resume the engine, then open the gate."""
        await asyncio.to_thread(self.gated.resume)

    async def shutdown(self) -> None:
        """Tear the engine (and server) down."""
        await asyncio.to_thread(self.gated.shutdown)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def drain(self) -> int:
        """Synchronize this rank's own device (by LOCAL_RANK, never the thread's current device)."""
        return await asyncio.to_thread(self._drain)

    async def server_base_urls(self) -> list[str]:
        """This rank's server base URLs."""
        return list(self.gated.server_base_urls())

    async def health(self) -> dict[str, Any]:
        """Rank, gate state, rollouts running now (and the most at once), calls received."""
        return {
            "rank": self.rank,
            "gate": self.gated.gate.state(),
            "active": self._active,
            "max_active": self._max_active,
            "calls": self._calls,
            **self.gated.gate.counters(),
        }

    async def ping(self) -> float:
        """The actor's clock; the cheapest control call (for latency measurements)."""
        return time.time()


def rank_local(rank: int) -> int:
    """The local rank of a worker: ``LOCAL_RANK`` in its environment when set, else 0 (one device per actor)."""
    import os

    raw = os.environ.get("LOCAL_RANK")
    return int(raw) if raw and raw.isdigit() else 0


class CollectorBody:
    """What the collector actor does: an :class:`AsyncCollector` and its :class:`ReplayBuffer`, in one actor.

    The driver tells it the weight version on every ``resume(weight_version)`` and ``sample(weight_version)``.
    ``rollout_factory()`` is called inside the actor and returns the rollout (sync or async
    ``Prompt -> TrajectoryGroup``); ``prompts`` is an iterable (or a zero-argument callable returning one).
    """

    def __init__(
        self,
        rollout_factory: Callable[[], Callable[[Prompt], Any]],
        prompts: Iterable[Any] | Callable[[], Iterable[Any]],
        *,
        num_prompts_per_step: int,
        max_trajectory_age_steps: int,
        cap: InFlightCap | int | None = None,
        weight_version: int = 0,
        pause_timeout_s: float = 600.0,
    ) -> None:
        self._version = weight_version
        self.buffer = ReplayBuffer(num_prompts_per_step, max_trajectory_age_steps, weight_version=weight_version)
        source = prompts() if callable(prompts) else prompts
        self.collector = AsyncCollector(
            rollout_factory(),
            source,
            self.buffer,
            lambda: self._version,
            cap=cap,
            pause_timeout_s=pause_timeout_s,
            name="ray-collector",
        )

    async def pause(self) -> None:
        """Stop starting rollouts; returns when none is in flight."""
        await asyncio.to_thread(self.collector.pause)

    async def resume(self, weight_version: int) -> None:
        """Start rollouts again, generated by weights of ``weight_version``."""
        self._version = weight_version
        await asyncio.to_thread(self.collector.resume)

    async def sample(self, weight_version: int, timeout: float | None = None) -> list[TrajectoryGroup]:
        """Exactly ``num_prompts_per_step`` groups young enough for ``weight_version`` (blocks; data group)."""
        return await asyncio.to_thread(self.buffer.sample, weight_version, timeout)

    async def stats(self) -> dict[str, float]:
        """Buffer and collector metrics."""
        return {**self.buffer.stats().as_metrics(), **self.collector.stats().as_metrics()}

    async def state_dict(self) -> dict[str, Any]:
        """The buffer's JSON-able state (for the driver's checkpoint_extra)."""
        return self.buffer.state_dict()

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the buffer."""
        self.buffer.load_state_dict(state)

    async def close(self) -> None:
        """Stop the collector for good."""
        await asyncio.to_thread(self.collector.close)

    async def ping(self) -> float:
        """The actor's clock."""
        return time.time()


def _control(name: str, base: Callable[..., Any]) -> Callable[..., Any]:
    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await base(self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = name
    method.__doc__ = base.__doc__
    return ray.method(concurrency_group=CONTROL_GROUP)(method)


def _actor_class(
    body: type,
    control: Sequence[str],
    name: str,
    *,
    separate_control_group: bool,
    control_concurrency: int,
    max_concurrency: int,
    extra_groups: dict[str, int] | None = None,
) -> Any:
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ConfigError("max_concurrency", max_concurrency, "a positive integer")
    if isinstance(control_concurrency, bool) or not isinstance(control_concurrency, int) or control_concurrency < 1:
        raise ConfigError("control_concurrency", control_concurrency, "a positive integer")
    attrs: dict[str, Any] = {"__module__": __name__, "__qualname__": name}
    options: dict[str, Any] = {"max_concurrency": max_concurrency, "num_cpus": 0}
    groups = dict(extra_groups or {})
    if separate_control_group:
        for m in control:
            attrs[m] = _control(m, getattr(body, m))
        groups[CONTROL_GROUP] = control_concurrency
    if groups:
        options["concurrency_groups"] = groups
    return ray.remote(**options)(type(name, (body,), attrs))


def make_worker_class(
    *,
    separate_control_group: bool = True,
    control_concurrency: int = 8,
    max_concurrency: int = RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY,
) -> Any:
    """The Ray actor class of a rollout worker (``.remote(rank, factory, ...)`` creates one).

    Control methods go to their own ``"control"`` group (``control_concurrency`` slots) unless
    ``separate_control_group=False``; ``generate`` runs in the default group (``max_concurrency`` slots).
    """
    name = "RolloutWorker" if separate_control_group else "RolloutWorkerOneQueue"
    return _actor_class(
        RolloutWorkerBody,
        WORKER_CONTROL_METHODS,
        name,
        separate_control_group=separate_control_group,
        control_concurrency=control_concurrency,
        max_concurrency=max_concurrency,
    )


def make_collector_class(
    *, separate_control_group: bool = True, control_concurrency: int = 4, max_concurrency: int = 64
) -> Any:
    """The Ray actor class of the collector; ``sample`` (which blocks) runs in the default group."""
    name = "CollectorActor" if separate_control_group else "CollectorActorOneQueue"
    return _actor_class(
        CollectorBody,
        COLLECTOR_CONTROL_METHODS,
        name,
        separate_control_group=separate_control_group,
        control_concurrency=control_concurrency,
        max_concurrency=max_concurrency,
    )


RolloutWorker = make_worker_class()
"""Rollout worker actor class with control calls in their own concurrency group."""

CollectorActor = make_collector_class()
"""Collector actor class with control calls in their own concurrency group."""


__all__ = [
    "COLLECTOR_CONTROL_METHODS",
    "CONTROL_GROUP",
    "WORKER_CONTROL_METHODS",
    "CollectorActor",
    "CollectorBody",
    "RolloutWorker",
    "RolloutWorkerBody",
    "WorkerFactory",
    "make_collector_class",
    "make_worker_class",
    "rank_local",
]
