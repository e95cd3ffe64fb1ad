"""AsyncCollector with rollouts parked through a handoff (the default ``inflight="park"``).

The accounting ``started == completed + failed + deferred + in_flight`` holds at every observation, and a
checkpoint taken while rollouts are parked neither loses nor duplicates one: the parked rollouts' prompts are
saved to be issued again by a restored run, while the live run just finishes them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, RolloutDeferred, TrajectoryGroup
from colo_fsm.errors import WaitTimeout


class Drawn:
    """An endless prompt stream ``q0, q1, ...`` that records what was drawn and can restart at an index."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        with self.lock:
            p = Prompt(f"q{self.index}", f"text {self.index}", {"n": self.index})
            self.index += 1
            self.ids.append(p.prompt_id)
        return p


class Controlled:
    """A rollout whose outcome the test decides: each call waits until told to finish, fail or defer."""

    def __init__(self, version: list[int]) -> None:
        self.version = version
        self.lock = threading.Lock()
        self.waiting: dict[str, threading.Event] = {}
        self.outcome: dict[str, str] = {}
        self.first: dict[str, int] = {}

    def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        ev = threading.Event()
        with self.lock:
            self.waiting[prompt.prompt_id] = ev
            self.first[prompt.prompt_id] = self.version[0]
        ev.wait(20)
        with self.lock:
            out = self.outcome.pop(prompt.prompt_id, "finish")
            self.waiting.pop(prompt.prompt_id, None)
            first = self.first.pop(prompt.prompt_id)
        if out == "fail":
            raise RuntimeError("rollout failed on purpose")
        if out == "defer":
            raise RolloutDeferred("told to defer")
        last = self.version[0]
        c = Completion("x", (1, 2), first, weight_versions=(first, last), logprobs=(-0.1, -0.2))
        return TrajectoryGroup(prompt.prompt_id, prompt.text, (c,), (1.0,), weight_version=first)

    def resolve(self, how: str) -> str | None:
        """Tell the oldest waiting rollout how to end; its prompt id (None if none waits)."""
        with self.lock:
            if not self.waiting:
                return None
            pid = min(self.waiting, key=lambda p: int(p[1:]))
            self.outcome[pid] = how
            self.waiting.pop(pid).set()
            return pid

    def release_all(self, collector: AsyncCollector) -> None:
        """Pause, then let every rollout in flight finish (so that closing waits for nobody)."""
        collector.pause()
        deadline = time.monotonic() + 10
        while collector.in_flight and time.monotonic() < deadline:
            with self.lock:
                for ev in self.waiting.values():
                    ev.set()
            time.sleep(0.002)


def _balanced(c: AsyncCollector) -> bool:
    s = c.stats()
    return s.started == s.completed + s.failed + s.deferred + s.in_flight


def _wait(pred, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _ended(c: AsyncCollector) -> int:
    s = c.stats()
    return s.completed + s.failed + s.deferred


def _num(pid: str) -> int:
    return int(pid[1:])


def test_checkpoint_while_parked_neither_loses_nor_duplicates_on_restore() -> None:
    version = [0]
    stream = Drawn()
    roll = Controlled(version)
    buffer = ReplayBuffer(2, 1)
    collector = AsyncCollector(roll, stream, buffer, lambda: version[0], cap=4)
    trained: list[str] = []
    try:
        collector.resume()
        assert _wait(lambda: len(roll.waiting) == 4)
        for _ in range(2):
            roll.resolve("finish")
        trained += [g.prompt_id for g in buffer.sample(version[0], timeout=10)]
        collector.pause()  # park: the other rollouts stay in flight
        assert collector.in_flight >= 2 and collector.parked == collector.in_flight
        saved = json.loads(json.dumps({"index": stream.index, "collector": collector.state_dict()}))
        parked_at_save = [p["prompt_id"] for p in saved["collector"]["parked_prompts"]]
        assert parked_at_save and parked_at_save == sorted(parked_at_save, key=_num)
        version[0] += 1  # the training step
        # the live run: the parked rollouts finish after the step and land in the buffer (spanning two versions)
        collector.resume()
        for _ in parked_at_save:
            roll.resolve("finish")
        assert _wait(lambda: all(p not in {q.prompt_id for q in collector.in_flight_prompts} for p in parked_at_save))
        live = buffer.sample(version[0], timeout=10)
        assert {g.prompt_id for g in live} <= set(parked_at_save)
        assert all(g.version_span == 1 and g.weight_version == 0 for g in live)
        assert _balanced(collector)
    finally:
        roll.release_all(collector)
        collector.close()

    # a run restored from the checkpoint: the parked prompts are issued again, first, once each
    stream2 = Drawn(index=saved["index"])
    roll2 = Controlled(version)
    buffer2 = ReplayBuffer(2, 1)
    collector2 = AsyncCollector(roll2, stream2, buffer2, lambda: version[0], cap=4)
    collector2.load_state_dict(saved["collector"])  # restores the buffer too
    assert [p.prompt_id for p in collector2.returned_prompts] == parked_at_save
    restored_trained = list(trained)
    try:
        collector2.resume()
        for _ in range(3):
            assert _wait(lambda: len(roll2.waiting) >= 2)
            roll2.resolve("finish")
            roll2.resolve("finish")
            restored_trained += [g.prompt_id for g in buffer2.sample(version[0], timeout=10)]
            collector2.pause()
            version[0] += 1
            collector2.resume()
        collector2.pause()
        state = collector2.state_dict()
        assert _balanced(collector2)
    finally:
        roll2.release_all(collector2)
        collector2.close()
    everything = (
        restored_trained
        + [g["prompt_id"] for g in state["replay_buffer"]["groups"]]
        + [p["prompt_id"] for p in state["returned_prompts"] + state["parked_prompts"]]
    )
    assert len(everything) == len(set(everything)), "a prompt was rolled out twice"
    assert sorted(everything, key=_num) == [f"q{i}" for i in range(stream2.index)], "a prompt was lost"
    assert restored_trained[len(trained) : len(trained) + len(parked_at_save)] == parked_at_save


@pytest.mark.parametrize(("inflight", "cap"), [("park", 3), ("drain", 2)])
def test_stats_count_what_each_pause_found_in_flight(inflight: str, cap: int) -> None:
    """``pauses`` and ``in_flight_at_pause`` say what each handoff found: park keeps 3 rollouts in flight, and a
    drain reports the 2 it waited for, though none is in flight once it returns."""
    version = [0]
    roll = Controlled(version)
    collector = AsyncCollector(roll, Drawn(), ReplayBuffer(2, 1), lambda: version[0], cap=cap, inflight=inflight)
    try:
        assert (collector.stats().pauses, collector.stats().in_flight_at_pause) == (0, 0)
        collector.resume()
        assert _wait(lambda: len(roll.waiting) == cap)
        pausing = threading.Thread(target=collector.pause)
        pausing.start()
        assert _wait(lambda: collector.paused)
        if inflight == "drain":  # the pause waits for these; park's returned at once
            while roll.resolve("finish"):
                pass
        pausing.join(10)
        assert not pausing.is_alive()
        collector.pause()  # already paused: not a second handoff
        s = collector.stats()
        assert (s.pauses, s.in_flight_at_pause) == (1, cap), inflight
        assert s.in_flight == (cap if inflight == "park" else 0), inflight
        assert s.as_metrics()["collector/in_flight_at_pause"] == float(cap)
    finally:
        roll.release_all(collector)
        collector.close()


OPS = st.lists(
    st.sampled_from(["resume", "pause", "finish", "finish", "fail", "defer", "sample", "step", "checkpoint"]),
    min_size=1,
    max_size=25,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, cap=st.integers(1, 4))
def test_accounting_stays_exact_with_parked_rollouts(ops: list[str], cap: int) -> None:
    """Any interleaving of pause/resume, rollouts finishing, failing or deferring (parked ones included), steps
    and checkpoints: the counters balance, and every drawn prompt is in exactly one place."""
    version = [0]
    stream = Drawn()
    roll = Controlled(version)
    buffer = ReplayBuffer(1, 1)
    collector = AsyncCollector(roll, stream, buffer, lambda: version[0], cap=cap, max_consecutive_failures=1000)
    consumed: list[str] = []
    failed: list[str] = []
    try:
        for op in ops:
            if op == "resume":
                collector.resume()
            elif op == "pause":
                collector.pause()
            elif op in ("finish", "fail", "defer"):
                n = _ended(collector)
                pid = roll.resolve(op)
                if pid is not None:
                    assert _wait(lambda n=n: _ended(collector) > n)
                    if op == "fail":
                        failed.append(pid)
            elif op == "sample":
                try:
                    consumed += [g.prompt_id for g in buffer.sample(version[0], timeout=0)]
                except WaitTimeout:
                    pass
            elif op == "step":
                collector.pause()
                version[0] += 1
                buffer.advance(version[0])
            elif op == "checkpoint":
                collector.pause()
                state = collector.state_dict()
                places = (
                    consumed
                    + failed
                    + [g["prompt_id"] for g in state["replay_buffer"]["groups"]]
                    + [p["prompt_id"] for p in state["returned_prompts"] + state["parked_prompts"]]
                )
                evicted = buffer.stats().evicted_stale
                assert len(places) == len(set(places)), f"a prompt in two places: {sorted(places, key=_num)}"
                assert len(places) + evicted == len(stream.ids), (places, evicted, stream.ids)
            s = collector.stats()
            assert s.started == s.completed + s.failed + s.deferred + s.in_flight, s
            assert s.parked <= s.in_flight and (s.parked == 0 or s.paused or s.spanning >= 0)
    finally:
        roll.release_all(collector)
        collector.close()
    assert _balanced(collector)
