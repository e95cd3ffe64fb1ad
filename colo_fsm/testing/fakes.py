"""Recording fakes of the three adapters: they do nothing but record every call, in one shared journal.

Use them to unit-test a loop or a lifecycle variant, and as the reference adapters the property-based
lifecycle machine runs against. A fake can be told to raise or hang in any method (fault injection).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.adapters.protocols import StepResult
from colo_fsm.guards.mode import ModelMode, ModeReport


@dataclass
class Journal:
    """Calls made to the fakes, in order: ``(component, method, weight_version_seen)`` tuples."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, component: str, method: str) -> None:
        with self.lock:
            self.calls.append((component, method))

    def methods(self, component: str | None = None) -> list[str]:
        """Method names called (on one component, or ``component.method`` for all)."""
        return [m if component else f"{c}.{m}" for c, m in self.calls if component in (None, c)]

    def count(self, component: str, method: str) -> int:
        return sum(1 for c, m in self.calls if c == component and m == method)


class _Faulty:
    component = "?"

    def __init__(self, journal: Journal | None = None) -> None:
        self.journal = journal or Journal()
        self.faults: dict[str, BaseException] = {}
        self.hangs: dict[str, float] = {}

    def fail_on(self, method: str, exc: BaseException | None = None) -> None:
        """Make the next call of ``method`` raise ``exc`` (a RuntimeError by default)."""
        self.faults[method] = exc or RuntimeError(f"injected fault in {self.component}.{method}")

    def hang_on(self, method: str, seconds: float) -> None:
        """Make the next call of ``method`` sleep ``seconds`` first."""
        self.hangs[method] = seconds

    def _call(self, method: str) -> None:
        self.journal.add(self.component, method)
        if method in self.hangs:
            time.sleep(self.hangs.pop(method))
        if method in self.faults:
            raise self.faults.pop(method)


@dataclass(frozen=True)
class RequestCounts:
    """Requests an engine holds: waiting to start, being stepped, parked by a suspend."""

    queued: int = 0
    running: int = 0
    parked: int = 0


class RecordingEngine(_Faulty):
    """A fake colocated engine that tracks its own condition, parks its requests, and refuses impossible calls.

    Requests (:meth:`submit`) run while awake: each :meth:`decode_step` advances every running request by one
    token. ``suspend`` parks the running ones at the step boundary; ``resume`` continues each parked request
    exactly once (``resumes[id]`` counts it). ``decode_steps`` counts decode steps, ``decode_while_parked`` the
    ones forced while the engine was suspended (what an engine that keeps serving a paused collector does).
    """

    component = "engine"

    def __init__(
        self,
        journal: Journal | None = None,
        *,
        reads_weights_in_place: bool = True,
        urls: Sequence[str] = (),
        tokens_per_request: int = 3,
        up: bool = False,
    ) -> None:
        super().__init__(journal)
        self.reads_weights_in_place = reads_weights_in_place
        self.urls = list(urls)
        self.builds = 0
        self.up_at_construction = up  # built (with its server) in the constructor, as NeMo-RL's MegatronGeneration
        self.condition = "awake" if up else "absent"
        self.tokens_per_request = tokens_per_request
        self.queued: dict[int, int] = {}  # request id -> tokens left
        self.running: dict[int, int] = {}
        self.parked: dict[int, int] = {}
        self.finished: list[int] = []
        self.on_token: dict[int, Callable[..., Any]] = {}  # request id -> its on_token, while it runs
        self.resumes: dict[int, int] = {}
        self.decode_steps = 0
        self.decode_while_parked = 0
        self.decode_in_flight = False
        self._next_request = 0

    def bring_up(self) -> None:
        self._call("bring_up")
        if self.up_at_construction:
            raise RuntimeError("bring_up of an engine built in its constructor (a spec that adopts it builds nothing)")
        self.builds += 1
        self.condition = "awake"
        self.running.update(self.queued)
        self.queued.clear()

    def suspend(self) -> None:
        self._call("suspend")
        if self.condition != "torn_down":
            self.condition = "suspended"
            self.parked.update(self.running)
            self.running.clear()

    def resume(self) -> None:
        self._call("resume")
        if self.condition in ("absent", "torn_down"):
            raise RuntimeError(f"resume of an engine that is {self.condition}")
        self.condition = "awake"
        for rid in self.parked:
            self.resumes[rid] = self.resumes.get(rid, 0) + 1
        self.running.update(self.parked)
        self.parked.clear()
        self.running.update(self.queued)
        self.queued.clear()

    def shutdown(self) -> None:
        self._call("shutdown")
        self.condition = "torn_down"
        self.queued.clear()
        self.running.clear()
        self.parked.clear()
        self.on_token.clear()

    def submit(
        self,
        tokens: int | Sequence[int] | None = None,
        *,
        max_tokens: int | None = None,
        on_token: Callable[..., Any] | None = None,
    ) -> int:
        """A request arrives (a rollout, validation or HTTP request); it waits while the engine is not awake.

        ``tokens``: how many tokens it decodes (default ``tokens_per_request``), or its prompt ids as a real
        engine takes them, with ``max_tokens``. ``on_token(token_id, logprob, weight_version)`` is called for each
        token a decode step makes for it, as a real engine calls it from its loop."""
        rid = self._next_request
        self._next_request += 1
        if self.condition == "torn_down":
            raise RuntimeError("request after shutdown")
        if tokens is None or not isinstance(tokens, int):
            left = self.tokens_per_request if max_tokens is None else max_tokens
        else:
            left = tokens
        (self.running if self.condition == "awake" else self.queued)[rid] = left
        if on_token is not None:
            self.on_token[rid] = on_token
        return rid

    def decode_step(self, *, force: bool = False) -> int:
        """One decode step over the running requests (a no-op unless awake, or ``force``d); returns tokens made."""
        if self.condition != "awake":
            work = self.parked or self.queued
            if not force or not work:
                return 0
            self.decode_while_parked += 1  # the bug this fake lets a test show: decode during a handoff
        else:
            work = self.running
        if not work:
            return 0
        self.decode_steps += 1
        for rid in list(work):
            work[rid] -= 1
            deliver = self.on_token.get(rid)
            if work[rid] <= 0:
                del work[rid]
                self.on_token.pop(rid, None)
                self.finished.append(rid)
            if deliver is not None:
                deliver(self.decode_steps, 0.0, 0)
        return 1

    def request_counts(self) -> RequestCounts:
        """Queued, running and parked requests now."""
        return RequestCounts(len(self.queued), len(self.running), len(self.parked))

    def server_base_urls(self) -> Sequence[str]:
        return list(self.urls)


class ModalEngine(RecordingEngine):
    """A recording engine that mutates a (simulated) shared model's mode the way a real one does.

    Bring-up and resume set ``inference_mode``; :meth:`decode_step` sets the decode-time expert padding from
    rank-local state (as megatron-core's controller does per step); suspend resets every switch to the
    training mode, unless ``reset_on_suspend=False`` (the bug: padding stays as the last decode step left it).
    """

    def __init__(self, journal: Journal | None = None, *, reset_on_suspend: bool = True, **kwargs: Any) -> None:
        super().__init__(journal, **kwargs)
        self.training_mode = ModelMode(expert_padding=False, inference_dispatchers=0)
        self.mode = self.training_mode
        self.reset_on_suspend = reset_on_suspend

    def bring_up(self) -> None:
        super().bring_up()
        self.mode = dataclasses.replace(self.mode, inference_mode=True)

    def decode_step(self, *, force: bool = False, padding: bool | None = None) -> int:
        """One decode step (as :meth:`RecordingEngine.decode_step`) that also sets expert padding from this rank's
        own state when ``padding`` is given, as a real decode step does; returns tokens made."""
        made = super().decode_step(force=force)
        if padding is not None:
            self.mode = dataclasses.replace(self.mode, expert_padding=padding)
        return made

    def suspend(self) -> None:
        super().suspend()
        if self.reset_on_suspend:
            self.mode = self.training_mode
        else:
            self.mode = dataclasses.replace(self.mode, inference_mode=False)

    def resume(self) -> None:
        super().resume()
        self.mode = dataclasses.replace(self.mode, inference_mode=True)

    def model_mode(self) -> ModeReport:
        """The simulated model's current mode and its training mode."""
        return ModeReport(current=self.mode, training=self.training_mode)


def count_samples(batch: Any) -> int:
    """Samples in a batch: a mapping of per-sample columns counts its first column's rows, never its keys;
    anything else with a ``len`` counts that; otherwise 0."""
    if isinstance(batch, Mapping):
        first = next(iter(batch.values()), ())
        return len(first) if hasattr(first, "__len__") else 0
    return len(batch) if hasattr(batch, "__len__") else 0


class RecordingTrainer(_Faulty):
    """A fake trainer: counts steps and saves, keeps saved checkpoints in memory."""

    component = "trainer"

    def __init__(self, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.steps = 0
        self.saves: list[tuple[int, int, Mapping[str, Any]]] = []
        self.pending_saves = 0  # saves started and not finalized (a spec with a finalize action finalizes them)

    def train_step(self, batch: Any) -> StepResult:
        self._call("train_step")
        self.steps += 1
        return StepResult(metrics={"loss": 1.0 / self.steps}, consumed_samples=count_samples(batch))

    def offload_buffers(self) -> None:
        self._call("offload_buffers")

    def restore_buffers(self) -> None:
        self._call("restore_buffers")

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        self._call("save_checkpoint")
        self.saves.append((step, weight_version, dict(extra_state)))
        self.pending_saves += 1

    def finalize_checkpoint(self) -> None:
        """Every save started so far is complete (an async save's finalize)."""
        self._call("finalize_checkpoint")
        self.pending_saves = 0


class RecordingCollector(_Faulty):
    """A fake collector that tracks whether it is paused and the weight version each resume handed it.

    With an ``engine`` (a :class:`RecordingEngine`), :meth:`start_rollout` submits a request to it while
    running; paused, it issues nothing (rollouts already in the engine stay parked there).
    """

    component = "collector"

    def __init__(self, journal: Journal | None = None, *, engine: RecordingEngine | None = None) -> None:
        super().__init__(journal)
        self.running = False
        self.engine = engine
        self.versions: list[int] = []
        self.rollouts: list[int] = []
        self.taken_back: list[Any] = []

    def pause(self) -> None:
        self._call("pause")
        self.running = False

    def resume(self, weight_version: int | None = None) -> None:
        self._call("resume")
        self.running = True
        if weight_version is not None:
            self.versions.append(weight_version)

    def take_back(self, unused: list[Any]) -> int:
        """What a stop hands back (the unused batch; ``taken_back``); no rollout of this fake is in flight."""
        self._call("take_back")
        self.running = False
        self.taken_back.extend(unused)
        return 0

    def start_rollout(self) -> int | None:
        """Issue one rollout to the engine (only while running); returns its request id."""
        if not self.running or self.engine is None:
            return None
        rid = self.engine.submit()
        self.rollouts.append(rid)
        return rid


class RecordingDrain:
    """A drain that records which device it synchronized (always the one it was built for)."""

    def __init__(self, journal: Journal | None = None, local_rank: int = 0) -> None:
        self.journal = journal or Journal()
        self.local_rank = local_rank
        self.drained: list[int] = []

    def __call__(self) -> int:
        self.journal.add("device", "drain")
        self.drained.append(self.local_rank)
        return self.local_rank


def recording_adapters(
    *, urls: Sequence[str] = (), engine_up: bool = False
) -> tuple[Journal, RecordingEngine, RecordingTrainer, RecordingCollector, RecordingDrain]:
    """One journal and the four recording fakes writing to it (``engine_up``: the engine is built in its
    constructor, for a spec that adopts it)."""
    j = Journal()
    engine = RecordingEngine(j, urls=urls, up=engine_up)
    return j, engine, RecordingTrainer(j), RecordingCollector(j, engine=engine), RecordingDrain(j)


class FakeClock:
    """A monotonic clock the test advances by hand (inject into :class:`~colo_fsm.guards.decision.MustSaveBy`)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move time forward; returns the new time."""
        if seconds < 0:
            raise ValueError("a clock only moves forward")
        self.now += seconds
        return self.now


@dataclass(frozen=True)
class ServedRequest:
    """One request the fake server answered: when it arrived and whether the engine was awake when served."""

    request_id: int
    arrived_state: str
    served_state: str
    engine_awake: bool


class FakeRequestSource:
    """Requests arriving at the OpenAI-compatible front at any time.

    A request is served at once when ``engine_awake()`` says so, else it waits (queued) until :meth:`pump` finds
    the engine awake. Every answer records whether the engine really was awake, so a test can assert that no
    request was ever served (decoded) while the engine was suspended.
    """

    def __init__(
        self, engine_awake: Callable[[], bool], state: Callable[[], str] = lambda: "?", journal: Journal | None = None
    ) -> None:
        self._awake = engine_awake
        self._state = state
        self.journal = journal or Journal()
        self.pending: list[tuple[int, str]] = []
        self.served: list[ServedRequest] = []
        self._next = 0

    def arrive(self) -> int:
        """A request arrives; returns its id."""
        rid = self._next
        self._next += 1
        self.journal.add("server", "request")
        self.pending.append((rid, self._state()))
        self.pump()
        return rid

    def pump(self) -> int:
        """Serve every waiting request if the engine is awake now; returns how many were served."""
        if not self.pending or not self._awake():
            return 0
        n = len(self.pending)
        for rid, arrived in self.pending:
            self.journal.add("server", "serve")
            self.served.append(ServedRequest(rid, arrived, self._state(), bool(self._awake())))
        self.pending.clear()
        return n


@dataclass
class FakeReplayBuffer:
    """Trajectories tagged with the weight version that generated them; nothing is lost, stale ones counted.

    ``sample(current_version)`` hands out every trajectory at most ``max_age_steps`` versions old and counts
    (drops, but counts) the older ones; ``give_back`` returns a batch a failed step did not train on.
    """

    max_age_steps: int = 1
    waiting: list[int] = field(default_factory=list)  # weight versions of buffered trajectories
    produced: int = 0
    trained: int = 0
    stale: int = 0
    max_trained_age: int = 0

    def add(self, n: int, weight_version: int) -> None:
        """``n`` trajectories generated at ``weight_version`` arrive."""
        self.waiting.extend([weight_version] * n)
        self.produced += n

    def sample(self, current_version: int) -> list[int]:
        """Take every fresh trajectory (its version) out of the buffer; count the stale ones."""
        fresh = [v for v in self.waiting if current_version - v <= self.max_age_steps]
        self.stale += len(self.waiting) - len(fresh)
        self.waiting = []
        return fresh

    def trained_on(self, batch: list[int], current_version: int) -> None:
        """The step trained on ``batch`` (at ``current_version``, before the bump)."""
        self.trained += len(batch)
        if batch:
            self.max_trained_age = max(self.max_trained_age, max(current_version - v for v in batch))

    def give_back(self, batch: list[int]) -> None:
        """A step failed before training on ``batch``: the trajectories go back, nothing is lost."""
        self.waiting = list(batch) + self.waiting

    @property
    def accounted(self) -> bool:
        """Every trajectory produced was trained on, counted stale, or is still waiting."""
        return self.produced == self.trained + self.stale + len(self.waiting)


__all__ = [
    "FakeClock",
    "FakeReplayBuffer",
    "FakeRequestSource",
    "Journal",
    "ModalEngine",
    "RecordingCollector",
    "RecordingDrain",
    "RecordingEngine",
    "RecordingTrainer",
    "RequestCounts",
    "ServedRequest",
    "recording_adapters",
]
