"""Measure lifecycle control-call latency on a worker actor saturated with rollout calls.

Used by ``bench/ray_control_latency.py`` and the Ray tests: submit more rollout calls than the actor runs at
once (so some queue), then issue control calls at a fixed interval without waiting for earlier ones, and
time each from submission to completion. :func:`measure_training_step` does the same for the training calls
of a step (issued while the engine is suspended and more than ``max_concurrency`` rollout calls wait for it).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from colo_fsm.ray.actors import WorkerAdapters
from colo_fsm.ray.fakes import HoldingGenerator, HoldingWorkerFactory


@ray.remote(num_cpus=0, max_concurrency=10_000)  # type: ignore[call-overload]  # an actor option ray's stubs omit
class Release:
    """A one-shot signal the test sends: held rollouts wait on it, so what runs before what does not depend on
    how fast the machine is (a rollout held for a fixed time may finish before a loaded test looks)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    async def wait(self) -> None:
        await self._event.wait()

    async def send(self) -> None:
        self._event.set()

    async def reset(self) -> None:
        self._event = asyncio.Event()


class HeldGenerator(HoldingGenerator):
    """Echoes each prompt once the test sends :class:`Release` (refuses unless its engine is awake)."""

    def __init__(self, engine: Any, release: Any) -> None:
        super().__init__(engine, 0.0)
        self.release = release

    async def agenerate(
        self, prompts: Any, *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Any]:
        self._out(prompts, max_tokens)
        await self.release.wait.remote()
        return self._out(prompts, max_tokens)


class HeldWorkerFactory(HoldingWorkerFactory):
    """:class:`~colo_fsm.ray.fakes.HoldingWorkerFactory` whose rollouts wait for ``release`` instead of a time."""

    def __init__(self, release: Any, **kwargs: Any) -> None:
        super().__init__(0.0, **kwargs)
        self.release = release

    def __call__(self, rank: int) -> WorkerAdapters:
        a = super().__call__(rank)
        return WorkerAdapters(a.engine, a.trainer, HeldGenerator(a.engine, self.release))


@dataclass
class SaturationResult:
    """Control-call latencies (seconds) measured while rollout calls saturated the actor."""

    label: str
    rollout_calls: int
    max_concurrency: int
    hold_s: float
    latencies_s: list[float] = field(default_factory=list)
    active_at_start: int = 0
    submit_s: float = 0.0
    completed_rollouts: int = 0
    completed_seen: list[int] = field(default_factory=list)
    """With ``control_method="health"``: how many of the submitted rollout calls had returned when each
    control call ran (0 for a call that did not queue behind them and ran before the first finished;
    at least ``rollout_calls - max_concurrency`` for one that waited in the same queue)."""
    returned_before_release: int = 0
    """With a :class:`Release`: control calls that returned while every rollout was still held."""
    calls_seen: list[int] = field(default_factory=list)
    """With ``control_method="health"``: how many of the submitted rollout calls the actor had started when each
    control call ran (all of them for a call queued behind them in one queue: Ray runs an actor's calls of one
    group in submission order)."""

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of the latencies (nearest rank)."""
        xs = sorted(self.latencies_s)
        if not xs:
            return float("nan")
        k = max(0, min(len(xs) - 1, round(q / 100 * (len(xs) - 1))))
        return xs[k]

    @property
    def p50(self) -> float:
        """Median latency."""
        return self.percentile(50)

    @property
    def p99(self) -> float:
        """99th percentile latency."""
        return self.percentile(99)

    def summary(self) -> dict[str, Any]:
        """JSON-able summary (milliseconds)."""
        d = asdict(self)
        d.pop("latencies_s")
        d.update(
            n=len(self.latencies_s),
            p50_ms=self.p50 * 1e3,
            p99_ms=self.p99 * 1e3,
            mean_ms=statistics.fmean(self.latencies_s) * 1e3 if self.latencies_s else float("nan"),
            max_ms=max(self.latencies_s) * 1e3 if self.latencies_s else float("nan"),
        )
        return d


async def _timed_control_calls(
    worker: Any, method: str, n: int, interval_s: float, timeout_s: float
) -> list[tuple[float, Any]]:
    """Issue ``n`` control calls ``interval_s`` apart without waiting; each latency is submission to completion.
    Returns (latency, result) pairs (result None for a call that timed out)."""

    async def one(ref: Any, t0: float) -> tuple[float, Any]:
        try:
            out = await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)
        except TimeoutError:
            return timeout_s, None
        return time.monotonic() - t0, out

    tasks = []
    for _ in range(n):
        t0 = time.monotonic()
        tasks.append(asyncio.ensure_future(one(getattr(worker, method).remote(), t0)))
        await asyncio.sleep(interval_s)
    return list(await asyncio.gather(*tasks))


def measure_control_latency(
    worker: Any,
    *,
    label: str,
    rollout_calls: int,
    max_concurrency: int,
    hold_s: float,
    control_calls: int = 30,
    interval_s: float = 0.02,
    control_method: str = "ping",
    settle_s: float = 0.3,
    probe_active: bool = False,
    timeout_s: float = 60.0,
    release: Any = None,
    wait_before_release_s: float | None = None,
) -> SaturationResult:
    """Saturate ``worker`` with ``rollout_calls`` ``generate`` calls, then time ``control_calls`` control calls.

    The worker's generator must hold each call ``hold_s`` seconds (e.g. :class:`~colo_fsm.ray.fakes.HoldingGenerator`).
    Control calls are issued every ``interval_s`` without waiting for the previous one. With
    ``control_method="health"`` the result also says how many rollouts had returned when each control call ran
    (:attr:`SaturationResult.completed_seen`), which shows queueing independently of the machine's speed.

    With ``release`` (a :class:`Release` the worker's rollouts wait on: :class:`HeldWorkerFactory`) no rollout
    finishes until the control calls were issued and waited for ``wait_before_release_s`` (default: until all
    returned); :attr:`SaturationResult.returned_before_release` counts those that returned while every rollout
    was held. Latencies are then not measured.
    """
    if release is not None:
        ray.get(release.reset.remote())
    res = SaturationResult(label, rollout_calls, max_concurrency, hold_s)
    ray.get(getattr(worker, control_method).remote())  # warm the control path
    before = ray.get(worker.health.remote())
    completed_before, calls_before = before["completed"], before["calls"]
    t0 = time.monotonic()
    rollouts = [worker.generate.remote([f"p{i}"], 4, 0.0, None) for i in range(rollout_calls)]
    res.submit_s = time.monotonic() - t0
    # let the actor start as many rollouts as it can (the rest queue); only an actor whose control calls have
    # their own group can be asked how many run without that question queueing too
    time.sleep(settle_s)
    if probe_active:
        res.active_at_start = _probe_active(worker, min(rollout_calls, max_concurrency), time.monotonic() + timeout_s)
    if release is not None:
        refs = []
        for _ in range(control_calls):
            refs.append(getattr(worker, control_method).remote())
            time.sleep(interval_s)
        wait = timeout_s if wait_before_release_s is None else wait_before_release_s
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait)
        res.returned_before_release = len(ready)
        ray.get(release.send.remote())
        timed = [(float("nan"), out) for out in ray.get(refs, timeout=timeout_s)]
    else:
        timed = asyncio.run(_timed_control_calls(worker, control_method, control_calls, interval_s, timeout_s))
        res.latencies_s = [lat for lat, _ in timed]
    res.completed_seen = [
        out["completed"] - completed_before for _, out in timed if isinstance(out, dict) and "completed" in out
    ]
    res.calls_seen = [out["calls"] - calls_before for _, out in timed if isinstance(out, dict) and "calls" in out]
    done, _ = ray.wait(rollouts, num_returns=len(rollouts), timeout=timeout_s)
    res.completed_rollouts = len(done)
    return res


def _probe_active(worker: Any, target: int, deadline: float) -> int:
    """Poll the worker's running rollout count (its ``health`` control call) until it reaches ``target``."""
    active = 0
    while time.monotonic() < deadline:
        active = ray.get(worker.health.remote())["active"]
        if active >= target:
            break
        time.sleep(0.05)
    return active


def _settled_health(
    worker: Any, calls_before: int, completed_before: int, rollout_calls: int, max_concurrency: int, deadline: float
) -> dict[str, Any]:
    """The worker's ``health`` once every rollout call that can reach it while suspended has (all ``rollout_calls``,
    or as many as the slots the finished ones left allow) and every call it counted is accounted for: finished,
    waiting at the gate or running. ``health`` runs in the control group's thread while rollout calls still arrive
    in theirs, so one read can catch a call counted on arrival but not yet waiting at the gate (or one past the
    gate, not yet counted finished); while suspended nothing else moves, so the first read with none in between is
    one consistent snapshot, whatever the machine's pace (the last read when ``deadline`` passes first).
    A call that never reaches the gate leaves the snapshot unsettled, and the suspend test's accounting red."""
    now = time.monotonic()
    while True:
        health = ray.get(worker.health.remote(), timeout=max(1.0, deadline - now))
        now = time.monotonic()
        arrived = min(rollout_calls, health["completed"] - completed_before + max_concurrency)
        in_between = health["calls"] - health["completed"] - health["waiting"] - health["active"]
        if health["calls"] - calls_before == arrived and in_between == 0:
            return health
        if now >= deadline:
            return health
        time.sleep(0.02)


@dataclass
class SuspendResult:
    """One suspend issued while rollout calls saturated the actor, and what happened to those rollouts."""

    label: str
    rollout_calls: int
    hold_s: float
    suspend_s: float
    active_after_suspend: int
    waiting_at_gate: int
    rollouts_ok: int
    rollouts_failed: int
    completed_at_suspend: int = 0
    """Rollout calls that had returned when the engine was suspended (at most ``max_concurrency`` when the
    suspend did not queue behind the rollouts submitted before it)."""
    calls_at_suspend: int = 0
    """Rollout calls the actor had started (taken a slot for) while suspended, once every submitted call had
    arrived: each one either finished before the gate closed or waits at it."""


def measure_suspend(
    worker: Any,
    *,
    label: str,
    rollout_calls: int,
    hold_s: float,
    settle_s: float = 0.3,
    suspended_for_s: float = 0.2,
    timeout_s: float = 60.0,
    release: Any = None,
    max_concurrency: int = 1000,
) -> SuspendResult:
    """Saturate ``worker``, suspend it, check nothing runs while suspended, resume, and count the rollouts.

    With control calls in their own group, ``suspend`` waits only for the rollouts already running (their
    remaining hold); queued rollouts wait at the gate and run after ``resume``. In one shared queue, the
    suspend call itself first waits for a free slot behind the queued rollouts.

    With ``release`` the suspend is issued while ``max_concurrency`` rollouts are held running (and the rest
    queued), and the rollouts are released only once the gate is closed: what ran before the suspend is then a
    count the machine's speed cannot change.
    """
    if release is not None:
        ray.get(release.reset.remote())
    before = ray.get(worker.health.remote())
    completed_before, calls_before = before["completed"], before["calls"]
    rollouts = [worker.generate.remote([f"s{i}"], 4, 0.0, None) for i in range(rollout_calls)]
    t0 = time.monotonic()
    if release is None:
        time.sleep(settle_s)
        t0 = time.monotonic()
        ray.get(worker.suspend.remote(), timeout=timeout_s)
    else:
        _probe_active(worker, min(rollout_calls, max_concurrency), time.monotonic() + timeout_s)
        suspending = worker.suspend.remote()
        deadline = time.monotonic() + timeout_s
        while ray.get(worker.health.remote(), timeout=timeout_s)["gate"] == "open" and time.monotonic() < deadline:
            time.sleep(0.02)
        ray.get(release.send.remote())
        ray.get(suspending, timeout=timeout_s)
    suspend_s = time.monotonic() - t0
    health = _settled_health(
        worker, calls_before, completed_before, rollout_calls, max_concurrency, time.monotonic() + timeout_s
    )
    time.sleep(suspended_for_s)
    ray.get(worker.resume.remote(), timeout=timeout_s)
    ok, failed = _outcomes(rollouts, timeout_s)
    return SuspendResult(
        label,
        rollout_calls,
        hold_s,
        suspend_s,
        health["active"],
        health["waiting"],
        ok,
        failed,
        completed_at_suspend=health["completed"] - completed_before,
        calls_at_suspend=health["calls"] - calls_before,
    )


def _outcomes(rollouts: list[Any], timeout_s: float) -> tuple[int, int]:
    ok = failed = 0
    for ref in rollouts:
        try:
            ray.get(ref, timeout=timeout_s)
            ok += 1
        except Exception:  # a rollout that ran while suspended raises in HoldingGenerator; a gate timeout raises
            failed += 1
    return ok, failed


@dataclass
class TrainingResult:
    """Latency of a step's training calls issued while rollout calls saturated a suspended worker."""

    label: str
    rollout_calls: int
    latencies_s: dict[str, float] = field(default_factory=dict)
    """Seconds from submission to completion of ``restore_buffers``, ``train_step``, ``offload_buffers``."""
    parked_at_start: int = -1
    """Rollout calls waiting at the closed gate when the training calls were issued (-1: not probed)."""
    rollouts_ok: int = 0
    rollouts_failed: int = 0

    @property
    def step_s(self) -> float:
        """The three training calls together."""
        return sum(self.latencies_s.values())

    def summary(self) -> dict[str, Any]:
        """JSON-able summary (milliseconds)."""
        d = asdict(self)
        d.pop("latencies_s")
        d.update({f"{k}_ms": v * 1e3 for k, v in self.latencies_s.items()}, step_ms=self.step_s * 1e3)
        return d


def measure_training_step(
    worker: Any,
    batch: Any,
    *,
    label: str,
    rollout_calls: int,
    probe_parked: int | None = None,
    settle_s: float = 0.3,
    timeout_s: float = 60.0,
) -> TrainingResult:
    """Suspend ``worker``, submit ``rollout_calls`` ``generate`` calls (they wait at the closed gate, or in the
    actor's queue once ``max_concurrency`` of them wait), time ``restore_buffers``, ``train_step(batch)`` and
    ``offload_buffers`` one after the other, then resume and collect the rollouts.

    With ``probe_parked`` (only for an actor whose control calls have their own group: the probe is one too),
    wait until that many rollout calls wait at the gate before training; otherwise wait ``settle_s``. In a
    single queue the training calls wait for slots held by rollouts that are themselves waiting for the
    resume, so they complete only when those rollouts give up (the worker's ``request_timeout_s``).
    """
    ray.get(worker.suspend.remote(), timeout=timeout_s)
    res = TrainingResult(label, rollout_calls)
    rollouts = [worker.generate.remote([f"t{i}"], 4, 0.0, None) for i in range(rollout_calls)]
    if probe_parked is not None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            res.parked_at_start = ray.get(worker.health.remote(), timeout=timeout_s)["waiting"]
            if res.parked_at_start >= probe_parked:
                break
            time.sleep(0.05)
    else:
        time.sleep(settle_s)
    for method, args in (("restore_buffers", ()), ("train_step", (batch,)), ("offload_buffers", ())):
        t0 = time.monotonic()
        ray.get(getattr(worker, method).remote(*args), timeout=timeout_s)
        res.latencies_s[method] = time.monotonic() - t0
    ray.get(worker.resume.remote(), timeout=timeout_s)
    res.rollouts_ok, res.rollouts_failed = _outcomes(rollouts, timeout_s)
    return res


__all__ = [
    "HeldGenerator",
    "HeldWorkerFactory",
    "Release",
    "SaturationResult",
    "SuspendResult",
    "TrainingResult",
    "measure_control_latency",
    "measure_suspend",
    "measure_training_step",
]
