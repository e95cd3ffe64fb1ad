"""Single-controller wiring: driver-side proxies that implement the adapter protocols by fanning out to actors.

The driver runs one :class:`~colo_fsm.machine.lifecycle.Lifecycle` (``world_size=1``) whose engine is a
:class:`RayEngineProxy` (every control call goes to every worker's control group and is gathered), whose
trainer is a :class:`RayTrainerProxy` (every worker runs its own rank's step, on the model its engine
generates from), whose collector is a :class:`RayCollectorProxy`, and whose drain is a :class:`RayDrain`:
each worker drains its own device and the gather acts as the barrier (no rank is told to go on before every
rank has drained).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from colo_fsm.adapters.protocols import Completion, StepResult
from colo_fsm.collector.buffer import TrajectoryGroup
from colo_fsm.collector.collector import Prompt
from colo_fsm.errors import ConfigError, WaitTimeout
from colo_fsm.log import get_logger

log = get_logger(__name__)


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


def _describe(index: int, info: Mapping[str, Any]) -> str:
    return f"worker {index} (rank {info['rank']}, {info['engine']}, pid {info['pid']})"


def _worker_infos(workers: Sequence[Any], timeout: float | None) -> list[dict[str, Any]]:
    if not workers:
        raise ConfigError("workers", workers, "at least one worker actor handle")
    return list(_get([w.info.remote() for w in workers], timeout, f"info() from {len(workers)} workers"))


class RayEngineProxy:
    """A ``GenerationEngine`` and ``TextGenerator`` over per-rank worker actors (single controller).

    Control calls (``bring_up``, ``suspend``, ``resume``, ``shutdown``) go to every worker and return when
    all have answered. ``generate`` spreads prompts round-robin over the workers.

    ``reads_weights_in_place`` is the workers' engines' own flag, asked once at construction (which waits for
    the workers to be built). All workers must agree; a mismatch raises :class:`ConfigError` naming the
    workers on each side. A False flag makes an asynchronous :class:`~colo_fsm.machine.lifecycle.Lifecycle`
    refuse the proxy (:class:`~colo_fsm.errors.UnsupportedEngine`), exactly as it refuses such an engine
    in-process.
    """

    reads_weights_in_place: bool

    def __init__(self, workers: Sequence[Any], *, control_timeout_s: float | None = 600.0) -> None:
        infos = _worker_infos(workers, control_timeout_s)
        self.workers = list(workers)
        self.control_timeout_s = control_timeout_s
        self.worker_info = infos
        flags = {i: bool(info["reads_weights_in_place"]) for i, info in enumerate(infos)}
        if len(set(flags.values())) > 1:
            raise ConfigError(
                "workers.reads_weights_in_place",
                {str(v): [_describe(i, infos[i]) for i, f in flags.items() if f is v] for v in (True, False)},
                "every worker's engine to agree (all read the training weights in place, or none does)",
            )
        self.reads_weights_in_place = next(iter(flags.values()))
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
        """Suspend every worker: each parks its rollouts' requests in its engine at a decode-step boundary
        (``inflight="park"``, answered after the resume) or lets them finish first (``"drain"``)."""
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


def split_batch(batch: Any, rank: int, world: int) -> list[Any]:
    """Data-parallel sharding (the :class:`RayTrainerProxy` default): worker ``rank`` of ``world`` gets one
    contiguous chunk of the sequence ``batch``; chunk sizes differ by at most one, and every item goes to
    exactly one worker. A batch that is not a sequence, or shorter than ``world``, raises :class:`ConfigError`."""
    if isinstance(batch, str | bytes) or not isinstance(batch, Sequence):
        raise ConfigError(
            "batch", type(batch).__name__, f"a sequence to split over {world} workers (or pass shard=replicate_batch)"
        )
    if len(batch) < world:
        raise ConfigError("batch", f"{len(batch)} items", f"at least one item per worker ({world} workers)")
    base, extra = divmod(len(batch), world)
    start = rank * base + min(rank, extra)
    return list(batch[start : start + base + (1 if rank < extra else 0)])


def replicate_batch(batch: Any, rank: int, world: int) -> Any:
    """Every worker gets the whole batch (e.g. tensor-parallel ranks that all see the same data)."""
    return batch


def combine_step_results(results: Sequence[StepResult]) -> StepResult:
    """One ``StepResult`` from every worker's: each metric is the unweighted mean over the workers that report
    it (a NaN or inf on any rank shows in the mean); ``consumed_samples`` is the sum.

    The sum is right for :func:`split_batch` (each sample trained on one rank). With :func:`replicate_batch`
    every worker consumed the same samples: pass a ``combine`` that takes one rank's count instead. A metric
    the trainer already all-reduced (as the megatron trainer does for loss and reward) is the same on every
    rank, so its mean is that value.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for r in results:
        for k, v in r.metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + 1
    metrics = {k: sums[k] / counts[k] for k in sums}
    return StepResult(metrics=metrics, consumed_samples=sum(int(r.consumed_samples) for r in results))


class RayTrainerProxy:
    """A ``Trainer`` over the per-rank workers' colocated trainers (single controller).

    Every call goes to every worker's ``"control"`` concurrency group (a training step never queues behind
    rollout calls) and returns when all have answered; each worker runs its own rank's trainer in its own
    process, on the model object its engine generates from. ``train_step(batch)`` sends worker ``i`` (in
    ``workers`` order, which is rank order) ``shard(batch, i, len(workers))`` (default :func:`split_batch`)
    and combines the per-worker results with ``combine`` (default :func:`combine_step_results`: metrics
    averaged, consumed samples summed); the per-worker results stay in :attr:`last_results`.
    ``save_checkpoint`` gives every worker the same ``extra_state``. Construction asks every worker for its
    trainer (waiting for the workers to be built) and raises :class:`ConfigError` naming those without one.
    """

    def __init__(
        self,
        workers: Sequence[Any],
        *,
        shard: Callable[[Any, int, int], Any] = split_batch,
        combine: Callable[[Sequence[StepResult]], StepResult] = combine_step_results,
        timeout_s: float | None = None,
    ) -> None:
        if not callable(shard):
            raise ConfigError("shard", shard, "a callable (batch, rank, world) -> that worker's batch")
        if not callable(combine):
            raise ConfigError("combine", combine, "a callable (per-worker StepResults) -> StepResult")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)):
            raise ConfigError("timeout_s", timeout_s, "seconds (a positive number) or None")
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError("timeout_s", timeout_s, "seconds (a positive number) or None")
        infos = _worker_infos(workers, timeout_s)
        missing = [_describe(i, info) for i, info in enumerate(infos) if info["trainer"] is None]
        if missing:
            raise ConfigError(
                "workers.trainer",
                {"without a trainer": missing},
                "every worker's adapters_factory to return a trainer (WorkerAdapters.trainer)",
            )
        self.workers = list(workers)
        self.worker_info = infos
        self.shard = shard
        self.combine = combine
        self.timeout_s = timeout_s
        self.last_results: list[StepResult] = []

    def _all(self, method: str, *args: Any) -> list[Any]:
        refs = [getattr(w, method).remote(*args) for w in self.workers]
        return list(_get(refs, self.timeout_s, f"{method}() on {len(refs)} workers"))

    def train_step(self, batch: Any) -> StepResult:
        """Every worker trains on its shard of ``batch``; returns the combined result."""
        n = len(self.workers)
        shards = [self.shard(batch, i, n) for i in range(n)]
        refs = [w.train_step.remote(s) for w, s in zip(self.workers, shards)]
        self.last_results = list(_get(refs, self.timeout_s, f"train_step() on {n} workers"))
        return self.combine(self.last_results)

    def offload_buffers(self) -> None:
        """Every worker frees its training-only memory."""
        self._all("offload_buffers")

    def restore_buffers(self) -> None:
        """Every worker brings its training-only memory back."""
        self._all("restore_buffers")

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        """Every worker saves its part (the workers' trainers run the checkpoint collectives among themselves)."""
        self._all("save_checkpoint", step, weight_version, dict(extra_state))


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
        """Pause the collector: no new rollouts; returns at once with the actor's ``inflight="park"`` (rollouts in
        flight stay parked in the engine) or when none is in flight with ``inflight="drain"``."""
        _get(self.actor.pause.remote(), self.control_timeout_s, "the collector to pause")

    def resume(self) -> None:
        """Resume the collector at the current weight version."""
        _get(self.actor.resume.remote(int(self._weight_version())), self.control_timeout_s, "the collector to resume")

    def take_back(self, unused: list[TrajectoryGroup]) -> int:
        """A stop hands the unused batch and the prompts in flight back to the collector actor, to be issued again
        after a restart (its ``state_dict``)."""
        return int(
            _get(self.actor.take_back.remote(list(unused)), self.control_timeout_s, "the collector to take back")
        )

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


__all__ = [
    "RayCollectorProxy",
    "RayDrain",
    "RayEngineProxy",
    "RayTextRollout",
    "RayTrainerProxy",
    "combine_step_results",
    "init_ray",
    "replicate_batch",
    "split_batch",
]
