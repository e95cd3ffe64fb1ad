"""Stop from anywhere: a loop that raises mid-step ends the run cleanly, from any state.

The step in progress is abandoned (never trained), the engine is torn down, and the batch the loop drew plus the
prompts of the rollouts in flight go back to the collector, so that a restart issues each of them again, once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

from colo_fsm import AsyncLifecycle, Lifecycle, LifecycleConfig, ValidationDecision
from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TextRollout
from colo_fsm.errors import ActionFailed, ConfigError
from colo_fsm.guards.drain import NoDeviceDrain
from colo_fsm.states import LIFECYCLE, NEMO_RL, State
from colo_fsm.states.spec import STOP_TRIGGER, Role
from colo_fsm.testing.fakes import RecordingTrainer, recording_adapters

S = State


class Prompts:
    """``q0, q1, ...``, each drawn once."""

    def __init__(self) -> None:
        self.n = 0

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        self.n += 1
        return Prompt(f"q{self.n - 1}", f"text {self.n - 1}", {"n": self.n - 1})


class ParkingEngine:
    """Serves its first ``free`` generate calls at once; later ones stay in flight (parked) until shutdown, which
    ends them with an error, as an engine aborting its requests does."""

    reads_weights_in_place = True

    def __init__(self, free: int) -> None:
        self.free = free
        self.cond = threading.Condition()
        self.stopped = False
        self.calls: list[str] = []
        self.held = 0

    def bring_up(self) -> None:
        self.calls.append("bring_up")

    def suspend(self) -> None:
        self.calls.append("suspend")

    def resume(self) -> None:
        self.calls.append("resume")

    def server_base_urls(self) -> list[str]:
        return []

    def shutdown(self) -> None:
        with self.cond:
            self.calls.append("shutdown")
            self.stopped = True
            self.cond.notify_all()

    def generate(self, prompts, *, max_tokens, temperature=0.0, seed=None):
        with self.cond:
            if self.free > 0:
                self.free -= 1
                return [Completion(f"{p}!", (1,), 0) for p in prompts]
            self.held += 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.stopped, timeout=30)
            raise RuntimeError("generate after shutdown")

    def wait_held(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.held >= n, timeout=30), f"{self.held} rollouts in flight, not {n}"


def _run(free: int = 2, cap: int = 4):
    engine = ParkingEngine(free)
    buffer = ReplayBuffer(num_prompts_per_step=2, max_trajectory_age_steps=1)
    holder: dict[str, Lifecycle] = {}
    collector = AsyncCollector(
        TextRollout(engine, lambda _p, _c: 1.0, samples_per_group=1, max_tokens=4),
        Prompts(),
        buffer,
        weight_version=lambda: holder["lc"].weight_version,
        cap=cap,
    )
    trainer = RecordingTrainer()
    lc = holder["lc"] = Lifecycle(
        engine, trainer, collector, config=LifecycleConfig(), drain=NoDeviceDrain("a test without a GPU")
    )
    return engine, buffer, collector, trainer, lc


def test_a_loop_that_raises_between_begin_step_and_train_stops_and_loses_nothing(caplog):
    engine, buffer, collector, trainer, lc = _run()
    lc.start()
    batch = buffer.sample(lc.weight_version, timeout=30)
    engine.wait_held(2)  # two more rollouts in flight, parked in the engine
    lc.begin_step()
    caplog.set_level(logging.INFO, logger="colo_fsm")
    try:
        raise RuntimeError("the loop's own bug, after begin_step and before train")
    except RuntimeError:
        assert lc.stop(unused=batch) is S.STOPPED
    collector.close(timeout=30)
    assert trainer.journal.count("trainer", "train_step") == 0  # abandoned, not trained
    assert lc.weight_version == 0 and lc.step_index == 0
    assert engine.calls.count("shutdown") == 1
    stats = collector.stats()
    assert stats.failed == 0 and stats.abandoned == 2 and stats.in_flight == 0, stats
    assert stats.started == stats.completed + stats.failed + stats.deferred + stats.abandoned + stats.in_flight
    saved = collector.state_dict()
    back = [p["prompt_id"] for p in saved["returned_prompts"]]
    assert sorted(back) == sorted([g.prompt_id for g in batch] + ["q2", "q3"]), back
    assert back[:2] == [g.prompt_id for g in batch]  # the batch first: it was drawn first
    assert saved["parked_prompts"] == [] and saved["replay_buffer"]["groups"] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []  # no rollout "failed" on the teardown
    assert any("step 0 abandoned, not trained" in r.getMessage() for r in caplog.records)

    # a restart issues each of them again, first and once
    engine2 = ParkingEngine(free=10)
    buffer2 = ReplayBuffer(num_prompts_per_step=2, max_trajectory_age_steps=2)
    again = AsyncCollector(
        TextRollout(engine2, lambda _p, _c: 1.0, samples_per_group=1, max_tokens=4),
        Prompts(),
        buffer2,
        weight_version=lambda: 0,
        cap=1,
    )
    again.load_state_dict({**saved, "replay_buffer": None})
    again.resume()
    groups = buffer2.sample(0, timeout=30) + buffer2.sample(0, timeout=30)
    again.close(timeout=30)
    assert [g.prompt_id for g in groups] == back


def test_stop_with_an_unused_batch_needs_a_collector_that_takes_it_back():
    _j, engine, trainer, collector, drain = recording_adapters()
    lc = Lifecycle(engine, trainer, None, drain=drain)
    lc.start()
    lc.begin_step()
    with pytest.raises(ConfigError, match="unused=.*take_back"):
        lc.stop(unused=[1, 2])
    assert lc.state is S.DRAINING  # refused before anything ran
    with pytest.raises(ConfigError, match="unused"):
        lc.stop(unused="batch")
    assert lc.stop() is S.STOPPED


def _to(spec, target: State, **kw):
    j, engine, trainer, collector, drain = recording_adapters()
    lc = Lifecycle(engine, trainer, collector, drain=drain, spec=spec, **kw)
    if target is not S.CREATED:
        lc.start()
    if target is S.DRAINING:
        lc.begin_step()
    elif target in (S.VALIDATING, S.DONE):
        while lc.state is not target:
            lc.step([1])
    return j, lc, collector


@pytest.mark.parametrize(
    ("spec", "target", "kw"),
    [
        (LIFECYCLE, S.CREATED, {}),
        (LIFECYCLE, S.GENERATING, {}),
        (LIFECYCLE, S.DRAINING, {}),
        (LIFECYCLE, S.VALIDATING, {"validation": ValidationDecision(1)}),
        (LIFECYCLE, S.DONE, {"config": LifecycleConfig(num_steps=1)}),
        (NEMO_RL, S.DRAINING, {}),
        (NEMO_RL, S.VALIDATING, {"validation": ValidationDecision(1)}),
        (NEMO_RL, S.DONE, {"config": LifecycleConfig(num_steps=1)}),
    ],
    ids=lambda v: getattr(v, "name", getattr(v, "value", "")),
)
def test_stop_from_every_resting_state_tears_down_once_and_trains_nothing(spec, target, kw):
    j, lc, collector = _to(spec, target, **kw)
    assert lc.state is target
    trained = j.count("trainer", "train_step")
    assert lc.stop(unused=[7] if target is not S.CREATED else None) is S.STOPPED
    assert j.count("trainer", "train_step") == trained  # nothing of the step is done after the stop
    assert j.count("engine", "shutdown") == (0 if target is S.CREATED else 1)
    if target is not S.CREATED:
        assert collector.taken_back == [7]
        assert j.calls[-2:] == [("collector", "take_back"), ("engine", "shutdown")]


def test_stop_after_a_failure_still_hands_back_and_tears_down():
    j, lc, collector = _to(LIFECYCLE, S.GENERATING)
    lc.trainer.fail_on("train_step")  # type: ignore[attr-defined]
    with pytest.raises(ActionFailed):
        lc.step([1])
    assert lc.state is S.FAILED
    assert lc.stop() is S.STOPPED
    assert j.calls[-2:] == [("collector", "take_back"), ("engine", "shutdown")]


def test_every_preset_can_stop_from_every_state_and_no_stop_does_step_work():
    from colo_fsm.states import PRESETS
    from colo_fsm.states.spec import STEP_WORK

    for spec in PRESETS.values():
        stops = {t.source: t for t in spec.transitions if t.trigger == STOP_TRIGGER}
        assert set(stops) == {s.state for s in spec.states if not s.terminal}, spec.name
        for t in stops.values():
            roles = [spec.action(a).role for a in t.actions]
            assert not set(roles) & set(STEP_WORK), (spec.name, t.source, roles)
            assert roles[-1] is Role.TEARDOWN and spec.state(t.dest).terminal


def test_async_lifecycle_stop_hands_the_batch_back():
    j, lc, collector = _to(LIFECYCLE, S.DRAINING)

    async def main() -> None:
        alc = AsyncLifecycle(lc)
        assert await alc.stop(unused=["g"]) is S.STOPPED

    asyncio.run(main())
    assert collector.taken_back == ["g"]


def test_take_back_refuses_what_is_not_a_group_and_changes_nothing():
    engine, buffer, collector, _trainer, lc = _run(free=0, cap=1)
    lc.start()
    engine.wait_held(1)
    with pytest.raises(ConfigError, match=r"unused\[0\]"):
        collector.take_back(["not a group"])
    assert collector.stats().in_flight == 1 and collector.returned_prompts == ()
    lc.stop()
    collector.close(timeout=30)
    assert [p.prompt_id for p in collector.returned_prompts] == ["q0"]
