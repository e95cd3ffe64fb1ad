"""Units of the testing toolkit: the journal audit, proxies, loop runner and fakes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from colo_fsm.states.spec import LIFECYCLE, EngineCondition
from colo_fsm.testing.fakes import FakeClock, FakeReplayBuffer, FakeRequestSource, RecordingEngine
from colo_fsm.testing.watch import (
    Conditions,
    EventLog,
    FaultSwitch,
    HandoffAudit,
    InjectedFault,
    LoopRunner,
    WatchedEngine,
)


def _log():
    return EventLog(lambda: "X", Conditions())


def _feed(calls, local_rank=2):
    log = _log()
    for comp, meth, detail in calls:
        log.add(comp, meth, "call", detail)
        log.add(comp, meth, "ok", detail)
    audit = HandoffAudit(LIFECYCLE, local_rank)
    return audit.feed(log.events)


GOOD = [
    ("engine", "bring_up", None),
    ("device", "synchronize", 2),
    ("barrier", "wait", None),
    ("collector", "resume", None),
    ("collector", "pause", None),
    ("engine", "suspend", None),
    ("device", "synchronize", 2),
    ("barrier", "wait", None),
    ("trainer", "train_step", 3),
    ("device", "synchronize", 2),
    ("barrier", "wait", None),
    ("engine", "resume", None),
]


def test_audit_accepts_the_handoff():
    assert _feed(GOOD) == []


def test_audit_catches_a_drain_of_another_device():
    bad = [(c, m, 0 if c == "device" else d) for c, m, d in GOOD]
    problems = _feed(bad)
    assert any("drained device 0, not the device named by LOCAL_RANK=2" in p for p in problems)
    assert any("barrier reached with build work still on device 2" in p for p in problems)


def test_audit_catches_resume_before_barrier():
    bad = [*GOOD[:-3], ("engine", "resume", None), ("device", "synchronize", 2), ("barrier", "wait", None)]
    assert any("starts decode work after train work" in p for p in _feed(bad))


def test_fault_switch_fires_once():
    f = FaultSwitch()
    f.arm("engine", "resume")
    f.check("engine", "suspend")
    with pytest.raises(InjectedFault, match=r"engine\.resume"):
        f.check("engine", "resume")
    f.check("engine", "resume")
    assert f.fired == [("engine", "resume")]


def test_watched_engine_runs_coroutines_on_the_owned_loop():
    class Async(RecordingEngine):
        async def resume(self):  # type: ignore[override]
            await asyncio.sleep(0)
            RecordingEngine.resume(self)

    runner = LoopRunner()
    log = _log()
    target = Async()
    target.condition = "suspended"
    w = WatchedEngine(target, log, FaultSwitch(), runner)
    w.resume()
    assert target.condition == "awake" and log.conditions.engine is EngineCondition.AWAKE
    # from another thread while the loop runs: hops onto the loop
    done = []

    async def main():
        await asyncio.get_running_loop().run_in_executor(None, lambda: done.append(w.resume()))

    runner.loop.run_until_complete(main())
    assert done == [None] and [e.phase for e in log.events].count("ok") == 2
    runner.close()


def test_watched_engine_records_errors_and_keeps_condition():
    log = _log()
    target = RecordingEngine()
    target.fail_on("suspend")
    w = WatchedEngine(target, log, FaultSwitch())
    w.bring_up()
    with pytest.raises(RuntimeError):
        w.suspend()
    assert log.conditions.engine is EngineCondition.AWAKE
    assert [(e.method, e.phase) for e in log.events][-2:] == [("suspend", "call"), ("suspend", "error")]


def test_fake_request_source_waits_for_the_engine():
    awake = threading.Event()
    src = FakeRequestSource(awake.is_set)
    src.arrive()
    assert src.pending and not src.served
    awake.set()
    assert src.pump() == 1 and src.served[0].engine_awake


def test_fake_replay_buffer_accounts_for_everything():
    b = FakeReplayBuffer(max_age_steps=1)
    b.add(3, 0)
    b.add(2, 2)
    batch = b.sample(2)  # version 0 is 2 old: stale, counted
    assert batch == [2, 2] and b.stale == 3
    b.give_back(batch)
    assert b.accounted and b.waiting == [2, 2]
    b.trained_on(b.sample(2), 2)
    assert b.accounted and b.trained == 2 and b.max_trained_age == 0


def test_fake_clock():
    c = FakeClock(10)
    assert c() == 10 and c.advance(2.5) == 12.5
    with pytest.raises(ValueError):
        c.advance(-1)
