"""Single-controller wiring: driver-side proxies that implement the adapter protocols by fanning out to actors.

The driver runs one :class:`~colo_fsm.machine.lifecycle.Lifecycle` (``world_size=1``) whose engine is a
:class:`RayEngineProxy` (every control call goes to every worker's control group and is gathered), whose
collector is a :class:`RayCollectorProxy`, and whose drain is a :class:`RayDrain`: each worker drains its own
device and the gather acts as the barrier (no rank is told to go on before every rank has drained).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import ray

from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector.buffer import TrajectoryGroup
from colo_fsm.collector.collector import Prompt
from colo_fsm.errors import ConfigError, WaitTimeout

log = logging.getLogger("colo_fsm.ray")


def init_ray(address: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """Start Ray locally (default) or connect to an existing cluster at ``address`` (e.g. ``"auto"``,
    ``"ray://head:10001"``); a no-op if Ray is already initialized. Returns the cluster resources."""
    if not ray.is_initialized():
        if address is not None and (not isinstance(address, str) or not address):
            raise ConfigError("address", address, "a Ray cluster address such as 'auto' or 'ray://host:10001'")
        kwargs.setdefault("include_dashboard", False)
        kwargs.setdefault("logging_level", logging.WARNING)
        ray.init(address=address, **kwargs)
    return dict(ray.cluster_resources())


def _get(refs: Any, timeout: float | None, what: str) -> Any:
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise WaitTimeout(what, timeout or 0.0) from None


class RayEngineProxy:
    """A ``GenerationEngine`` and ``TextGenerator`` over per-rank worker actors (single controller).

    Control calls (``bring_up``, ``suspend``, ``resume``, ``shutdown``) go to every worker and return when
    all have answered. ``generate`` spreads prompts round-robin over the workers.
    """

    reads_weights_in_place = True

    def __init__(self, workers: Sequence[Any], *, control_timeout_s: float | None = 600.0) -> None:
        if not workers:
            raise ConfigError("workers", workers, "at least one worker actor handle")
        self.workers = list(workers)
        self.control_timeout_s = control_timeout_s
        self._urls: list[str] = []
        self._rr = itertools.count()
        self.suspend_seconds: list[list[float]] = []

    def _all(self, method: str, *args: Any) -> list[Any]:
        refs = [getattr(w, method).remote(*args) for w in self.workers]
        return _get(refs, self.control_timeout_s, f"{method}() on {len(refs)} workers")

    def bring_up(self) -> None:
        """Build every worker's engine (and server) once; collects the base URLs in rank order."""
        self._urls = [u for urls in self._all("bring_up") for u in urls]

    def suspend(self) -> None:
        """Suspend every worker (each lets its in-flight rollouts finish first)."""
        self.suspend_seconds.append(self._all("suspend"))

    def resume(self) -> None:
        """Resume every worker."""
        self._all("resume")

    def shutdown(self) -> None:
        """Tear every worker's engine down."""
        self._all("shutdown")

    def server_base_urls(self) -> Sequence[str]:
        """Base URLs of all workers' servers, in rank order."""
        return list(self._urls)

    def health(self) -> list[dict[str, Any]]:
        """Every worker's health record."""
        return self._all("health")

    def generate(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        """One completion per prompt, prompts spread round-robin over the workers."""
        refs = [
            self.workers[next(self._rr) % len(self.workers)].generate.remote([p], max_tokens, temperature, seed)
            for p in prompts
        ]
        return [c for out in ray.get(refs) for c in out]


class RayDrain:
    """The lifecycle's ``drain``: every worker drains its own device; the gather is the barrier."""

    def __init__(self, workers: Sequence[Any], *, timeout_s: float | None = 600.0) -> None:
        if not workers:
            raise ConfigError("workers", workers, "at least one worker actor handle")
        self.workers = list(workers)
        self.timeout_s = timeout_s
        self.calls = 0

    def __call__(self) -> list[int]:
        """Drain all ranks; returns the device index each drained (-1 without CUDA)."""
        self.calls += 1
        return _get([w.drain.remote() for w in self.workers], self.timeout_s, "every worker to drain its device")


class RayCollectorProxy:
    """A ``Collector`` over the collector actor; also the driver's handle on its replay buffer.

    ``weight_version`` (e.g. ``lambda: lc.weight_version``) is read on every ``resume()`` and sent along.
    """

    def __init__(
        self, actor: Any, weight_version: Callable[[], int], *, control_timeout_s: float | None = 600.0
    ) -> None:
        if not callable(weight_version):
            raise ConfigError("weight_version", weight_version, "a callable returning the current weight version")
        self.actor = actor
        self._weight_version = weight_version
        self.control_timeout_s = control_timeout_s

    def pause(self) -> None:
        """Pause the collector; returns when none of its rollouts is in flight."""
        _get(self.actor.pause.remote(), self.control_timeout_s, "the collector to pause")

    def resume(self) -> None:
        """Resume the collector at the current weight version."""
        _get(self.actor.resume.remote(int(self._weight_version())), self.control_timeout_s, "the collector to resume")

    def sample(self, weight_version: int, timeout: float | None = None) -> list[TrajectoryGroup]:
        """Exactly ``num_prompts_per_step`` fresh groups (blocks up to ``timeout``)."""
        return ray.get(self.actor.sample.remote(weight_version, timeout))

    def stats(self) -> dict[str, float]:
        """Buffer and collector metrics."""
        return ray.get(self.actor.stats.remote())

    def state_dict(self) -> dict[str, Any]:
        """The buffer's state, for ``checkpoint_extra``."""
        return ray.get(self.actor.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the buffer."""
        ray.get(self.actor.load_state_dict.remote(state))

    def close(self) -> None:
        """Stop the collector actor's collection."""
        ray.get(self.actor.close.remote())


class RayTextRollout:
    """A rollout for the collector actor: one call per sample, spread over the worker actors.

    Each prompt group fans out ``samples_per_group`` ``generate`` calls (one per sample), which is what the
    in-flight cap's ``samples_per_group`` counts against the workers' ``max_concurrency``.
    """

    def __init__(
        self,
        workers: Sequence[Any],
        reward_fn: Callable[[Prompt, Completion], float],
        *,
        samples_per_group: int,
        max_tokens: int,
        temperature: float = 1.0,
    ) -> None:
        if not workers:
            raise ConfigError("workers", workers, "at least one worker actor handle")
        self.workers = list(workers)
        self.reward_fn = reward_fn
        self.samples_per_group = samples_per_group
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._rr = itertools.count()
        self._lock = threading.Lock()

    async def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        """Generate and score one group."""
        with self._lock:
            picks = [self.workers[next(self._rr) % len(self.workers)] for _ in range(self.samples_per_group)]
        per_sample = await asyncio.gather(
            *[w.generate.remote([prompt.text], self.max_tokens, self.temperature, None) for w in picks]
        )
        outs = [c for out in per_sample for c in out]
        rewards = [float(self.reward_fn(prompt, c)) for c in outs]
        return TrajectoryGroup(
            prompt.prompt_id,
            prompt.text,
            tuple(outs),
            tuple(rewards),
            weight_version=min(c.weight_version for c in outs),
            metadata=dict(prompt.metadata),
        )


__all__ = ["RayCollectorProxy", "RayDrain", "RayEngineProxy", "RayTextRollout", "init_ray"]
