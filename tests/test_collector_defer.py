"""AsyncCollector deferral: rollouts queued behind a serialized engine give their prompts back on pause.

A rollout raising ``RolloutDeferred`` is not a failure: its buffer place is released, its prompt goes back to
the front of the collector's queue (in draw order), it is counted in ``stats().deferred``, and it survives a
checkpoint through ``collector.state_dict()`` next to the prompt stream's position.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from colo_fsm.collector import AsyncCollector, CollectorStats, Prompt, ReplayBuffer, RolloutDeferred, TrajectoryGroup
from colo_fsm.errors import ColoFsmError, ConfigError, LifecycleError


class Drawn:
    """An endless prompt stream ``q0, q1, ...`` that records what was drawn and can restart at an index."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.ids: list[str] = []

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        p = Prompt(f"q{self.index}", f"text {self.index}", {"n": self.index})
        self.index += 1
        self.ids.append(p.prompt_id)
        return p


class SerializedEngine:
    """A rollout over one engine that generates one call at a time, deferring when the collector is paused."""

    def __init__(self, gen_s: float, defer: bool = True) -> None:
        self.gen_s = gen_s
        self.defer = defer
        self.turn = threading.Lock()
        self.collector: AsyncCollector | None = None
        self.generated: list[str] = []
        self.generating = threading.Event()

    def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        assert self.collector is not None
        with self.turn:
            if self.defer and self.collector.should_defer():
                raise RolloutDeferred()
            self.generating.set()
            time.sleep(self.gen_s)
            self.generated.append(prompt.prompt_id)
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("a", "b"), (1.0, 0.0), weight_version=0)


def _make(
    engine: SerializedEngine, stream: Drawn, buffer: ReplayBuffer, version: list[int], cap: int, inflight: str = "drain"
) -> AsyncCollector:
    collector = AsyncCollector(engine, stream, buffer, lambda: version[0], cap=cap, inflight=inflight)
    engine.collector = collector
    return collector


def _balanced(s: CollectorStats) -> bool:
    return s.started == s.completed + s.failed + s.deferred + s.in_flight


def _num(prompt_id: str) -> int:
    return int(prompt_id[1:])


def test_pause_defers_queued_rollouts_and_resume_rolls_them_out_in_order() -> None:
    version = [0]
    stream = Drawn()
    buffer = ReplayBuffer(8, 1)
    engine = SerializedEngine(gen_s=0.06)
    collector = _make(engine, stream, buffer, version, cap=8)
    sampled: list[str] = []
    try:
        collector.resume()
        assert engine.generating.wait(5)
        deadline = time.monotonic() + 5
        while collector.in_flight < 8 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert collector.in_flight == 8  # one generating, seven queued behind the engine
        t0 = time.monotonic()
        collector.pause()
        waited = time.monotonic() - t0
        # only the generate call in progress is waited for (without deferral: ~7 more calls, >= 0.4 s)
        assert waited < 0.25, waited
        s = collector.stats()
        assert s.in_flight == 0 and s.failed == 0 and s.deferred >= 6 and _balanced(s)
        assert s.returned == s.deferred and collector.error is None
        returned = [p.prompt_id for p in collector.returned_prompts]
        assert returned == sorted(returned, key=_num)  # kept in draw order
        assert not set(returned) & set(engine.generated)

        version[0] += 1  # the "training step"
        collector.resume()
        for _ in range(3):
            batch = buffer.sample(version[0], timeout=20)
            sampled += [g.prompt_id for g in batch]
            collector.pause()
            version[0] += 1
            collector.resume()
        collector.pause()
        # the deferred prompts were started again first, in draw order (buffer order is start order)
        again = [pid for pid in sampled if pid in returned]
        assert again == returned
        s = collector.stats()
        assert _balanced(s) and s.failed == 0 and s.completed == len(engine.generated)
        # nothing lost, nothing duplicated: every drawn prompt is trained, buffered or waiting to start again
        leftover = [g["prompt_id"] for g in buffer.state_dict()["groups"]]
        waiting = [p.prompt_id for p in collector.returned_prompts]
        accounted = sampled + leftover + waiting
        assert sorted(accounted, key=_num) == stream.ids
        assert len(set(engine.generated)) == len(engine.generated)
    finally:
        collector.close()


def test_deferred_while_collecting_is_retried_without_spinning_and_is_not_a_failure() -> None:
    refuse = threading.Event()
    refuse.set()
    calls = {"deferred": 0}

    def rollout(prompt: Prompt) -> TrajectoryGroup:
        if refuse.is_set():
            calls["deferred"] += 1
            raise RolloutDeferred("engine busy elsewhere")
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("x",), (1.0,), 0)

    buffer = ReplayBuffer(4, 1)
    collector = AsyncCollector(rollout, Drawn(), buffer, lambda: 0, cap=4, max_consecutive_failures=1)
    try:
        collector.resume()
        time.sleep(0.3)
        s = collector.stats()
        # retried after a short back-off, not in a hot loop (4 at a time, every ~50 ms)
        assert 4 <= calls["deferred"] <= 60, calls
        assert s.failed == 0 and collector.error is None and not collector.paused
        refuse.clear()
        batch = buffer.sample(0, timeout=10)
        assert [g.prompt_id for g in batch] == ["q0", "q1", "q2", "q3"]  # same prompts, same order
        collector.pause()
        s = collector.stats()
        assert s.deferred == calls["deferred"] and s.failed == 0 and _balanced(s)
    finally:
        collector.close()


def test_deferred_prompts_survive_a_checkpoint_of_the_stream_position() -> None:
    """The demo's checkpoint: stream index + buffer + collector state; resume skips and repeats nothing."""
    version = [0]
    stream = Drawn()
    buffer = ReplayBuffer(4, 1)
    engine = SerializedEngine(gen_s=0.03)
    collector = _make(engine, stream, buffer, version, cap=4)
    trained: list[str] = []
    try:
        collector.resume()
        for _ in range(2):
            trained += [g.prompt_id for g in buffer.sample(version[0], timeout=20)]
            collector.pause()
            version[0] += 1
            collector.resume()
        deadline = time.monotonic() + 5
        while collector.in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        collector.pause()
        saved = json.loads(
            json.dumps({"index": stream.index, "buffer": buffer.state_dict(), "collector": collector.state_dict()})
        )
    finally:
        collector.close()
    assert saved["collector"]["returned_prompts"], "the test needs a deferred prompt at the checkpoint"
    assert saved["collector"]["returned_prompts"][0]["metadata"]["n"] >= 0

    stream2 = Drawn(index=saved["index"])
    buffer2 = ReplayBuffer(4, 1)
    buffer2.load_state_dict(saved["buffer"])
    engine2 = SerializedEngine(gen_s=0.0)
    collector2 = _make(engine2, stream2, buffer2, version, cap=4)
    collector2.load_state_dict(saved["collector"])
    assert [p.prompt_id for p in collector2.returned_prompts] == [
        p["prompt_id"] for p in saved["collector"]["returned_prompts"]
    ]
    try:
        collector2.resume()
        for _ in range(3):
            trained += [g.prompt_id for g in buffer2.sample(version[0], timeout=20)]
            collector2.pause()
            version[0] += 1
            collector2.resume()
        collector2.pause()
        leftover = [g["prompt_id"] for g in buffer2.state_dict()["groups"]]
        waiting = [p.prompt_id for p in collector2.returned_prompts]
    finally:
        collector2.close()
    everything = trained + leftover + waiting
    assert len(set(everything)) == len(everything)  # nothing rolled out twice
    assert sorted(everything, key=_num) == [f"q{i}" for i in range(stream2.index)]  # nothing skipped


def test_state_dict_checks() -> None:
    engine = SerializedEngine(gen_s=0.2)
    collector = _make(engine, Drawn(), ReplayBuffer(2, 1), [0], cap=2)
    try:
        assert issubclass(RolloutDeferred, ColoFsmError) and "paused" in str(RolloutDeferred())
        assert collector.state_dict() == {
            "format": 2,
            "returned_prompts": [],
            "parked_prompts": [],
            "replay_buffer": collector.buffer.state_dict(),
        }
        with pytest.raises(ConfigError, match="state.format"):
            collector.load_state_dict({"format": 99})
        with pytest.raises(ConfigError, match="state"):
            collector.load_state_dict([])  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="returned_prompts"):
            collector.load_state_dict({"format": 1, "returned_prompts": "q0"})
        with pytest.raises(ConfigError, match="prompt_id"):
            collector.load_state_dict({"format": 1, "returned_prompts": [{"prompt_id": "", "text": "x"}]})
        collector.resume()
        assert engine.generating.wait(5)
        with pytest.raises(LifecycleError, match="in flight"):
            collector.state_dict()
        with pytest.raises(LifecycleError, match="while paused"):
            collector.load_state_dict({"format": 1, "returned_prompts": []})
    finally:
        collector.close()
