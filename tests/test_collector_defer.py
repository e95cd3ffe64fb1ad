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
from colo_fsm.collector import collector as collector_module
from colo_fsm.errors import ColoFsmError, ConfigError, LifecycleError
from tests.support.waits import wait_until


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
    """A rollout over one engine that generates one call at a time, deferring when the collector is paused.

    With ``gate``, a generate call holds until the test sets that Event (then takes ``gen_s`` as usual)."""

    def __init__(self, gen_s: float, defer: bool = True, gate: threading.Event | None = None) -> None:
        self.gen_s = gen_s
        self.defer = defer
        self.gate = gate
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
            if self.gate is not None:
                assert self.gate.wait(30), "the test never let the generate call finish"
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
    """A drain pause waits only for the generate call in progress: the rollouts queued behind the serialized engine
    defer instead of generating. Forced: the engine's first call holds on an Event, so all 8 rollouts are in
    flight (one generating, seven waiting for the engine) when the pause begins, and the call is let go only once
    the collector is paused and pause() is waiting for it. Counted, not timed: exactly one call is generated during
    the pause and the seven queued rollouts are deferred (without deferral the pause would wait for seven more
    calls). After the resume the deferred prompts are rolled out first, in draw order; none is lost or repeated."""
    version = [0]
    stream = Drawn()
    buffer = ReplayBuffer(8, 1)
    gate = threading.Event()
    engine = SerializedEngine(gen_s=0.0, gate=gate)
    collector = _make(engine, stream, buffer, version, cap=8)
    sampled: list[str] = []
    pause_errors: list[BaseException] = []

    def pause() -> None:
        try:
            collector.pause()
        except BaseException as exc:
            pause_errors.append(exc)

    pauser = threading.Thread(target=pause, name="pauser", daemon=True)
    try:
        collector.resume()
        assert engine.generating.wait(10), "no rollout started generating"
        wait_until(lambda: collector.in_flight == 8, "8 rollouts in flight, one generating and seven queued behind it")
        pauser.start()
        wait_until(lambda: collector.stats().pauses == 1, "the pause under way (counted in stats().pauses)")
        # the generate call is held: the drain cannot end and no queued rollout can reach the engine yet
        assert pauser.is_alive() and collector.paused and collector.in_flight == 8 and engine.generated == []
        gate.set()  # the call in progress finishes (and every later one goes straight through)
        pauser.join(30)
        assert not pauser.is_alive(), "pause() did not return once the generate call in progress had finished"
        assert not pause_errors, pause_errors
        assert len(engine.generated) == 1, (
            f"{len(engine.generated)} generate calls during the pause: the queued rollouts generated instead of "
            "deferring, and the pause waited for them"
        )
        s = collector.stats()
        assert s.in_flight == 0 and s.failed == 0 and s.completed == 1 and s.deferred == 7 and _balanced(s), s
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
        gate.set()  # a failure while the call was held leaves nothing waiting on it
        collector.close()


class ScriptedClock:
    """The collector's clock (its module's ``time.monotonic``), moved only by the test; counts how often it is read.

    The collector's loop reads it on every turn that finds room to start a rollout, so its reads count turns."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self.lock = threading.Lock()

    def monotonic(self) -> float:
        with self.lock:
            self.reads += 1
            return self.now

    def __getattr__(self, name: str) -> object:  # the rest of the time module, as it is
        return getattr(time, name)

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds

    def wait_turns(self, turns: int, what: str) -> None:
        with self.lock:
            target = self.reads + turns
        wait_until(lambda: self.reads >= target, f"{turns} turns of the collector's loop ({what})")


def test_deferred_while_collecting_is_retried_without_spinning_and_is_not_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rollout that defers while the collector is collecting (not paused) is retried after a back-off, not in a
    hot loop, and is not a failure (one failure would stop this collector). Forced with a scripted clock: the
    collector reads the test's clock, which moves only when the test moves it. With the clock short of the back-off
    nothing starts again however many turns the loop takes (counted by its reads of the clock); each move past it
    starts exactly one round of the 4 prompts, so the deferrals are 4 per round the test drove. A collector that
    retried at once would have deferred far more by then. The refusal is lifted between rounds, with nothing in
    flight, so the last round rolls the same prompts out in their draw order."""
    clock = ScriptedClock()
    monkeypatch.setattr(collector_module, "time", clock)
    backoff = collector_module._DEFER_RETRY_S
    refuse = threading.Event()
    refuse.set()
    deferred: list[str] = []

    def rollout(prompt: Prompt) -> TrajectoryGroup:
        if refuse.is_set():
            deferred.append(prompt.prompt_id)
            raise RolloutDeferred("engine busy elsewhere")
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("x",), (1.0,), 0)

    buffer = ReplayBuffer(4, 1)
    collector = AsyncCollector(rollout, Drawn(), buffer, lambda: 0, cap=4, max_consecutive_failures=1)
    rounds = 3
    try:
        collector.resume()
        for n in range(1, rounds + 1):
            wait_until(lambda n=n: collector.stats().deferred >= 4 * n, f"round {n} of deferrals")
            for moved in (0.0, backoff / 2):  # the clock where the round left it, then half the back-off later
                clock.advance(moved)
                clock.wait_turns(5, f"round {n}, clock moved {moved} s")
                s = collector.stats()
                assert s.deferred == len(deferred) == 4 * n, (
                    f"{s.deferred} deferrals after {n} round(s), with the clock {moved} s past the last one: "
                    "retried before the back-off (spinning)"
                )
            assert sorted(deferred[-4:], key=_num) == ["q0", "q1", "q2", "q3"], deferred
            assert s.in_flight == 0 and s.failed == 0 and collector.error is None and not collector.paused, s
            if n == rounds:
                refuse.clear()  # nothing in flight: the next round sees the engine free from its first prompt on
            clock.advance(backoff)  # past the back-off: one more round
        batch = buffer.sample(0, timeout=10)
        assert [g.prompt_id for g in batch] == ["q0", "q1", "q2", "q3"]  # same prompts, same order
        collector.pause()
        s = collector.stats()
        assert s.deferred == len(deferred) == 4 * rounds and s.failed == 0 and _balanced(s), s
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
