"""AsyncCollector with fakes: in-flight cap (lowered and reported), pause semantics, version tagging, failures."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time

import pytest

from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TextRollout, TrajectoryGroup
from colo_fsm.errors import ConfigError, RolloutFailed, WaitTimeout
from colo_fsm.guards.capacity import InFlightCap
from tests.support.waits import wait_until


class Probe:
    """A rollout that records concurrency, start/end times and the weight version it saw."""

    def __init__(self, version: list[int], delay: float = 0.01) -> None:
        self.version = version
        self.delay = delay
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.spans: list[tuple[float, float, int]] = []

    def enter(self) -> float:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        return time.monotonic()

    def leave(self, t0: float, v: int) -> None:
        with self.lock:
            self.active -= 1
            self.spans.append((t0, time.monotonic(), v))

    def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        t0 = self.enter()
        v = self.version[0]
        time.sleep(self.delay)
        self.leave(t0, v)
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("a", "b"), (1.0, 0.0), weight_version=99)


def prompts() -> itertools.count:
    return (f"q{i}" for i in itertools.count())  # type: ignore[return-value]


def test_constructor_validates() -> None:
    b = ReplayBuffer(2, 1)
    with pytest.raises(ConfigError, match="rollout"):
        AsyncCollector("nope", prompts(), b, lambda: 0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cap"):
        AsyncCollector(Probe([0]), prompts(), b, lambda: 0, cap=0)
    with pytest.raises(ConfigError, match=r"cap\.num_prompts_per_step"):
        AsyncCollector(Probe([0]), prompts(), b, lambda: 0, cap=InFlightCap(3, 1, samples_per_group=1))
    with pytest.raises(ConfigError, match="prompts"):
        AsyncCollector(Probe([0]), "abc", b, lambda: 0)  # type: ignore[arg-type]


def test_in_flight_cap_is_lowered_reported_once_and_respected(caplog: pytest.LogCaptureFixture) -> None:
    buffer = ReplayBuffer(8, 2)  # the age bound allows 8*2 = 16 groups in flight
    cap = InFlightCap(8, 2, samples_per_group=100, actor_max_concurrency=1000, control_headroom=200)
    assert cap.value == 8 and cap.lowered  # (1000-200)//100 = 8 < 16
    version = [0]
    probe = Probe(version, delay=0.02)
    with caplog.at_level(logging.WARNING, logger="colo_fsm"):
        collector = AsyncCollector(probe, prompts(), buffer, lambda: version[0], cap=cap)
    lowered = [r for r in caplog.records if "lowered by actor capacity" in r.getMessage()]
    assert (
        len(lowered) == 1 and "configured num_prompts_per_step*max_trajectory_age_steps=16" in lowered[0].getMessage()
    )
    try:
        collector.resume()
        for _ in range(3):
            batch = buffer.sample(version[0], timeout=10)
            assert len(batch) == 8
            collector.pause()
            version[0] += 1
            collector.resume()
        assert probe.max_active <= 8 and collector.stats().max_in_flight <= 8
        assert probe.max_active >= 2  # it does run rollouts concurrently
    finally:
        collector.close()
    assert len([r for r in caplog.records if "lowered" in r.getMessage()]) == 1


def test_drain_pause_waits_for_in_flight_and_nothing_starts_while_paused() -> None:
    version = [0]
    probe = Probe(version, delay=0.05)
    buffer = ReplayBuffer(4, 1)
    collector = AsyncCollector(probe, prompts(), buffer, lambda: version[0], cap=4, inflight="drain")
    paused_windows: list[tuple[float, float]] = []
    try:
        collector.resume()
        for _ in range(3):
            buffer.sample(version[0], timeout=10)
            collector.pause()
            t_paused = time.monotonic()
            assert collector.in_flight == 0 and probe.active == 0  # on return nothing is in flight
            time.sleep(0.08)  # the "training step"
            version[0] += 1
            paused_windows.append((t_paused, time.monotonic()))
            collector.resume()
    finally:
        collector.close()
    for start, end, _ in probe.spans:
        for p0, p1 in paused_windows:
            assert not (start < p1 and end > p0), "a rollout ran while the collector was paused"


class Parkable:
    """A rollout whose "engine" holds every request while suspended (``awake`` cleared), like a parked engine.

    The first weight version is read under the lock that counts the rollout ``active``: a test that sees 4 active
    and moves the version on cannot have a rollout read the new version as its first."""

    def __init__(self, version: list[int]) -> None:
        self.version = version
        self.awake = threading.Event()
        self.awake.set()
        self.lock = threading.Lock()
        self.active = 0
        self.starts: list[float] = []

    def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        with self.lock:
            first = self.version[0]
            self.active += 1
            self.starts.append(time.monotonic())
        time.sleep(0.01)  # some tokens under the first version
        self.awake.wait(10)  # parked while the engine is suspended
        last = self.version[0]
        with self.lock:
            self.active -= 1
        c = Completion("ab", (1, 2), first, weight_versions=(first, last), logprobs=(-0.5, -0.7))
        return TrajectoryGroup(prompt.prompt_id, prompt.text, (c,), (1.0,), weight_version=first)


def _balanced(collector: AsyncCollector) -> bool:
    s = collector.stats()
    return s.started == s.completed + s.failed + s.deferred + s.in_flight


def test_park_pause_returns_at_once_and_parked_rollouts_land_after_the_step() -> None:
    version = [0]
    roll = Parkable(version)
    buffer = ReplayBuffer(4, 1)
    collector = AsyncCollector(roll, prompts(), buffer, lambda: version[0], cap=4)
    assert collector.inflight == "park"
    try:
        roll.awake.clear()  # everything started from now on parks until the "resume"
        collector.resume()
        deadline = time.monotonic() + 10
        while roll.active < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
        collector.pause()  # returns at once: nothing waits for the parked rollouts
        assert collector.paused and collector.in_flight == 4 and roll.active == 4
        s = collector.stats()
        assert s.parked == 4 and s.completed == 0 and _balanced(collector)
        started = s.started
        t_paused = time.monotonic()
        version[0] += 1  # the "training step"
        time.sleep(0.05)
        assert collector.stats().started == started and len(roll.starts) == started  # nothing new while paused
        roll.awake.set()  # engine resumed: the parked rollouts finish under the new weights
        batch = buffer.sample(version[0], timeout=10)
        s = collector.stats()
        assert s.spanning >= 4 and s.version_changed_mid_rollout >= 4 and _balanced(collector)
        assert all(t < t_paused for t in roll.starts[:started])
        assert [(g.weight_version, g.newest_version, g.version_span) for g in batch] == [(0, 1, 1)] * 4
        assert all(g.age(version[0]) == 1 for g in batch)  # counted from the oldest version
    finally:
        roll.awake.set()
        collector.close()


@pytest.mark.parametrize("first_after_resume", [False, True], ids=["one-sample-after", "both-after"])
@pytest.mark.parametrize("paused_at_end", [True, False])
def test_a_collector_told_its_version_at_resume_still_sees_a_parked_samples_newer_weights(
    paused_at_end: bool, first_after_resume: bool
) -> None:
    """The Ray collector actor learns the weight version only at its own resume, which the spec orders after the
    engine's: a parked rollout can finish in between, one sample (or every sample: a rollout parked before any
    of its requests reached the engine) generated under the new weights. Forced here: the rollout ends while the
    collector is paused and still told the old version. Its group's newest version is the samples' (1), not the
    stale read (0), and so is its oldest where every sample is stamped 1 (a Ray run on a busy machine had it 0).
    The control: a stamp above the collector's read while collecting is the rollout's own tag, and the read
    stands."""
    told, engine = [0], [0]
    started, awake = threading.Event(), threading.Event()

    def rollout(prompt: Prompt) -> TrajectoryGroup:
        if not first_after_resume:
            first = Completion("a", (1,), engine[0])  # finished before the handoff
        started.set()
        assert awake.wait(30), "the test never resumed the engine"
        if first_after_resume:
            first = Completion("a", (1,), engine[0])  # held at the engine's gate too
        second = Completion("b", (2,), engine[0])  # held at the engine's gate, generated after its resume
        return TrajectoryGroup(prompt.prompt_id, prompt.text, (first, second), (1.0, 0.0), weight_version=0)

    buffer = ReplayBuffer(num_prompts_per_step=1, max_trajectory_age_steps=2)
    collector = AsyncCollector(rollout, iter(["p"]), buffer, lambda: told[0], cap=1)
    try:
        collector.resume()
        assert started.wait(30), "the rollout never started"
        if paused_at_end:
            collector.pause()  # park
        engine[0] = 1  # the training step wrote the weights; the engine resumes first
        awake.set()
        deadline = time.monotonic() + 30
        while collector.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        assert collector.in_flight == 0, "the rollout never finished"
        told[0] = 1  # the collector's own resume, after the engine's
        if paused_at_end:
            collector.resume()
        (group,) = buffer.sample(1, timeout=30)
    finally:
        awake.set()
        collector.close(timeout=30)
    stamped = [1, 1] if first_after_resume else [0, 1]
    assert [c.weight_version for c in group.samples] == stamped and group.samples[0].weight_versions == ()
    newest = 1 if paused_at_end else 0
    oldest = min(stamped[0], newest)
    assert (group.weight_version, group.newest_version) == (oldest, newest), (
        f"tagged {group.weight_version}..{group.newest_version} with samples stamped {stamped}, "
        f"{'paused' if paused_at_end else 'collecting'} at the rollout's end"
    )


def test_park_pause_does_not_wait_for_a_stuck_rollout_but_drain_times_out() -> None:
    """Forced: the pause comes once the stuck rollout has started (an Event it sets), not after a guessed sleep."""
    gate, started = threading.Event(), threading.Event()

    def stuck(prompt: Prompt) -> TrajectoryGroup:
        started.set()
        gate.wait(30)
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("x",), (1.0,), 0)

    collector = AsyncCollector(stuck, prompts(), ReplayBuffer(1, 0), lambda: 0, cap=1, pause_timeout_s=0.1)
    try:
        collector.resume()
        assert started.wait(30), "the rollout never started"
        collector.pause()  # park: no wait, no timeout
        assert collector.in_flight == 1 and collector.parked == 1
        assert [p.prompt_id for p in collector.in_flight_prompts] == ["p0"]
    finally:
        gate.set()
        collector.close()
    with pytest.raises(ConfigError, match="inflight"):
        AsyncCollector(stuck, prompts(), ReplayBuffer(1, 0), lambda: 0, inflight="pause")


def test_groups_carry_the_weight_version_of_generation_and_a_target() -> None:
    version = [3]
    buffer = ReplayBuffer(2, 1, weight_version=3)
    collector = AsyncCollector(Probe(version, 0.005), prompts(), buffer, lambda: version[0])
    try:
        collector.resume()
        seen: list[tuple[int, int | None]] = []
        for _ in range(4):
            batch = buffer.sample(version[0], timeout=10)
            seen += [(g.weight_version, g.target_step) for g in batch]
            assert all(0 <= g.age(version[0]) <= 1 for g in batch)
            collector.pause()
            version[0] += 1
            collector.resume()
    finally:
        collector.close()
    assert all(v != 99 for v, _ in seen)  # the rollout's own tag is replaced by the collector's
    assert {v for v, _ in seen} <= {3, 4, 5, 6}
    assert all(t is not None and v <= t <= v + 1 for v, t in seen)
    assert buffer.evicted_stale == 0


def test_async_rollout_function() -> None:
    active = {"now": 0, "max": 0}

    async def rollout(prompt: Prompt) -> TrajectoryGroup:
        active["now"] += 1
        active["max"] = max(active["max"], active["now"])
        await asyncio.sleep(0.02)
        active["now"] -= 1
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("x",), (0.5,), 0)

    buffer = ReplayBuffer(6, 1)
    collector = AsyncCollector(rollout, prompts(), buffer, lambda: 0, cap=6, inflight="drain")
    try:
        collector.resume()
        assert len(buffer.sample(0, timeout=10)) == 6
        collector.pause()
        assert active["now"] == 0
    finally:
        collector.close()
    assert 2 <= active["max"] <= 6


def test_repeated_failures_stop_collection_and_surface() -> None:
    calls = {"n": 0}

    def bad(prompt: Prompt) -> TrajectoryGroup:
        calls["n"] += 1
        raise ValueError("reward model down")

    buffer = ReplayBuffer(2, 1)
    collector = AsyncCollector(bad, prompts(), buffer, lambda: 0, cap=1, max_consecutive_failures=3)
    try:
        collector.resume()
        with pytest.raises(RolloutFailed, match="reward model down"):
            buffer.sample(0, timeout=10)
        time.sleep(0.05)
        assert calls["n"] == 3 and collector.stats().failed == 3
        collector.pause()
        with pytest.raises(RolloutFailed):
            collector.resume()
    finally:
        collector.close()


def test_an_isolated_failure_is_counted_and_collection_continues() -> None:
    n = itertools.count()

    def flaky(prompt: Prompt) -> TrajectoryGroup:
        if next(n) == 1:
            raise RuntimeError("transient")
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("x",), (1.0,), 0)

    buffer = ReplayBuffer(4, 0)
    collector = AsyncCollector(flaky, prompts(), buffer, lambda: 0, cap=1)
    try:
        collector.resume()
        assert len(buffer.sample(0, timeout=10)) == 4
        collector.pause()
        assert collector.stats().failed == 1 and collector.error is None
    finally:
        collector.close()


def test_exhausted_prompts_end_in_a_clear_timeout() -> None:
    """Two prompts for a batch of three: once both are drawn and rolled out nothing more can come, and a sample
    times out naming what finished. Forced: the sample is taken only after the collector ran out of prompts with
    nothing in flight, with no wait of its own (no bet on how fast the two rollouts finish)."""
    buffer = ReplayBuffer(3, 1)
    collector = AsyncCollector(Probe([0], 0.0), ["a", "b"], buffer, lambda: 0)
    try:
        collector.resume()
        wait_until(
            lambda: (s := collector.stats()).exhausted and s.in_flight == 0,
            "the collector out of prompts with none in flight",
        )
        with pytest.raises(WaitTimeout, match="2 finished"):
            buffer.sample(0, timeout=0)
        s = collector.stats()
        assert s.exhausted and s.completed == 2 and s.failed == 0, s
    finally:
        collector.close()


def test_pause_timeout_raises() -> None:
    """Forced: the drain pause comes once the stuck rollout has started (an Event it sets), so it has one to wait
    for; the rollout stays stuck until the test lets it go, far past the pause's timeout."""
    gate, started = threading.Event(), threading.Event()

    def stuck(prompt: Prompt) -> TrajectoryGroup:
        started.set()
        gate.wait(30)
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("x",), (1.0,), 0)

    collector = AsyncCollector(
        stuck, prompts(), ReplayBuffer(1, 0), lambda: 0, cap=1, pause_timeout_s=0.1, inflight="drain"
    )
    try:
        collector.resume()
        assert started.wait(30), "the rollout never started"
        with pytest.raises(WaitTimeout, match="in-flight rollouts"):
            collector.pause()
    finally:
        gate.set()
        collector.close()


class EchoGenerator:
    def __init__(self) -> None:
        self.version = 7

    def generate(self, prompts, *, max_tokens, temperature=0.0, seed=None):  # type: ignore[no-untyped-def]
        return [Completion(f"{p}!{i}", (i,), self.version) for i, p in enumerate(prompts)]


def test_text_rollout_builds_scored_groups() -> None:
    rollout = TextRollout(EchoGenerator(), lambda p, c: float(len(c.text)), samples_per_group=3, max_tokens=4)
    g = rollout(Prompt("id1", "hi", {"answer": "x"}))
    assert g.prompt_id == "id1" and len(g.samples) == 3 and g.weight_version == 7
    assert g.rewards == (4.0, 4.0, 4.0) and g.metadata == {"answer": "x"}
    with pytest.raises(ConfigError, match="samples_per_group"):
        TextRollout(EchoGenerator(), lambda p, c: 0.0, samples_per_group=0, max_tokens=4)


def test_admit_predicate_holds_back_new_rollouts() -> None:
    allowed = threading.Event()
    probe = Probe([0], 0.0)
    buffer = ReplayBuffer(2, 0)
    collector = AsyncCollector(probe, prompts(), buffer, lambda: 0, admit=allowed.is_set)
    try:
        collector.resume()
        time.sleep(0.1)
        assert collector.stats().started == 0 and len(buffer) == 0
        allowed.set()
        assert len(buffer.sample(0, timeout=10)) == 2
    finally:
        collector.close()


@pytest.mark.parametrize("hold", [True, False])
def test_hold_while_batch_waits_starts_nothing_until_the_trainer_takes_the_batch(hold: bool) -> None:
    """With the trainer's next batch in the buffer a held collector starts nothing (a drain handoff would have to
    wait for it), however many turns its loop takes (counted through the admit hook, which each turn asks first);
    once the batch is taken it starts again. Without the hold the same turns start rollouts."""
    turns = [0]

    def admit() -> bool:
        turns[0] += 1
        return True

    buffer = ReplayBuffer(num_prompts_per_step=2, max_trajectory_age_steps=2)  # room for 6 groups
    done = Completion(text="", token_ids=(), weight_version=0)
    for i in range(2):  # the next batch, already made
        assert buffer.put(TrajectoryGroup(f"made{i}", "", (done,), (0.0,), 0), ticket=buffer.reserve(0))
    collector = AsyncCollector(
        Probe([0], 0.0), prompts(), buffer, lambda: 0, cap=2, admit=admit, hold_while_batch_waits=hold
    )
    try:
        collector.resume()
        wait_until(lambda: turns[0] >= 25, "25 turns of the collector's loop")
        if not hold:
            assert collector.stats().started > 0, "the control: an unheld collector starts with a batch waiting"
            return
        assert collector.stats().started == 0, "a held collector started a rollout with a batch waiting"
        assert [g.prompt_id for g in buffer.sample(0, timeout=10)] == ["made0", "made1"]
        wait_until(lambda: collector.stats().started > 0, "a start once the batch was taken")
    finally:
        collector.close()
    with pytest.raises(ConfigError, match="hold_while_batch_waits"):
        AsyncCollector(Probe([0]), prompts(), buffer, lambda: 0, hold_while_batch_waits="yes")  # type: ignore[arg-type]


def check_version_stamp(collector_class: type[AsyncCollector] = AsyncCollector) -> None:
    """A rollout whose samples carry no per-token versions, started at weight version 3 and finished at 5 (the
    version moves while it is held), is stamped 3 (its oldest: its age counts from there) and 5 (its newest)."""
    version = [3]
    started, finish = threading.Event(), threading.Event()

    def rollout(prompt: Prompt) -> TrajectoryGroup:
        seen = version[0]
        started.set()
        assert finish.wait(30), "the test never let the rollout finish"
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("plain text",), (1.0,), weight_version=seen)

    buffer = ReplayBuffer(num_prompts_per_step=1, max_trajectory_age_steps=4)
    collector = collector_class(rollout, iter(["p"]), buffer, weight_version=lambda: version[0], cap=1)
    collector.resume()
    try:
        assert started.wait(30), "the rollout never started"
        version[0] = 5  # two steps trained while the rollout was in flight
        finish.set()
        (group,) = buffer.sample(5, timeout=30)
    finally:
        collector.close(timeout=30)
    assert group.samples[0].weight_versions == ()  # no per-token record: the collector's stamp is all there is
    assert (group.weight_version, group.newest_version) == (3, 5), (
        f"stamped with versions {group.weight_version}..{group.newest_version}: a rollout without per-token "
        "versions is stamped with its oldest version (3, read at its start), its age counted from there"
    )


def test_a_rollout_without_per_token_versions_is_stamped_with_its_oldest() -> None:
    check_version_stamp()


class Endless:
    """An async rollout that never finishes by itself (an engine request still decoding a long tail): it records
    whether it was cancelled (what aborts an engine request) or only closed by the garbage collector."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self.closed_unawaited = threading.Event()

    async def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        except GeneratorExit:  # the coroutine was dropped with its task pending: nobody cancelled it
            self.closed_unawaited.set()
            raise
        raise AssertionError("unreachable")


def _destroyed_tasks(caplog: pytest.LogCaptureFixture) -> list[str]:
    import gc

    gc.collect()
    return [r.getMessage() for r in caplog.records if "Task was destroyed" in r.getMessage()]


def test_close_cancels_a_rollout_that_outlives_its_wait_and_leaves_no_task_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """close() waits ``timeout`` for the rollouts in flight; one still running then is cancelled and awaited
    before the collector's event loop closes (not dropped pending: "Task was destroyed but it is pending!"), and
    its prompt is put back (not counted as a failure)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    rollout = Endless()
    collector = AsyncCollector(rollout, prompts(), ReplayBuffer(1, 1), lambda: 0, cap=1)
    collector.resume()
    assert rollout.started.wait(10), "the rollout never started"
    collector.close(timeout=0.2)
    assert rollout.cancelled.is_set(), "close() returned with the rollout still in flight, never cancelled"
    assert collector.in_flight == 0 and collector.stats().failed == 0
    assert [p.prompt_id for p in collector.returned_prompts] == ["p0"]  # put back: a restore issues it again
    assert not _destroyed_tasks(caplog) and not rollout.closed_unawaited.is_set()


def test_close_after_a_stop_cancels_the_rollouts_taken_back_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """Rollouts a stop took back (``take_back``) are discarded whatever they return: close() does not wait for
    them, it cancels them (an engine handle's request is aborted through its future) and awaits them."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    rollout = Endless()
    collector = AsyncCollector(rollout, prompts(), ReplayBuffer(2, 1), lambda: 0, cap=2)
    collector.resume()
    assert rollout.started.wait(10), "the rollout never started"
    assert collector.take_back() >= 1
    t0 = time.monotonic()
    collector.close(timeout=30)
    assert time.monotonic() - t0 < 10, "close() waited for rollouts a stop had taken back"
    assert rollout.cancelled.is_set() and collector.in_flight == 0 and collector.stats().failed == 0
    assert not _destroyed_tasks(caplog)
