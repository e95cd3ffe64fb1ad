"""The collector and buffer driven by a real Lifecycle (recording fakes): pause per handoff, checkpointed
buffer, ages, metrics against wall-clock, time in each state per step."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

from colo_fsm import CheckpointDecision, Lifecycle, LifecycleConfig, State, ValidationDecision
from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TrajectoryGroup, state_times_per_step, step_metrics
from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.metrics import MetricsLogger, read_metrics
from colo_fsm.testing.fakes import recording_adapters


class StateProbe:
    """A rollout that records the lifecycle state at its start and end."""

    def __init__(self) -> None:
        self.lc: Lifecycle | None = None
        self.lock = threading.Lock()
        self.active = 0
        self.records: list[tuple[str, str, int]] = []

    def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        assert self.lc is not None
        with self.lock:
            self.active += 1
        s0, v = self.lc.state.value, self.lc.weight_version
        time.sleep(0.003)
        with self.lock:
            self.active -= 1
            self.records.append((s0, self.lc.state.value, v))
        return TrajectoryGroup(prompt.prompt_id, prompt.text, ("a", "b"), (1.0, 0.0), 0)


@pytest.mark.parametrize(
    ("admit_in_generating", "inflight"), [(True, "drain"), (False, "drain"), (True, "park"), (False, "park")]
)
def test_lifecycle_pauses_the_collector_for_every_handoff_and_checkpoints_the_buffer(
    tmp_path, admit_in_generating, inflight
) -> None:
    """With or without ``admit``, no rollout starts during a training step or checkpoint; with ``drain`` none is
    even in flight then (with ``park`` the rollouts in flight keep going: these fake ones have no engine)."""
    journal, engine, trainer, _, drain = recording_adapters()
    buffer = ReplayBuffer(4, 1)
    probe = StateProbe()
    holder: dict[str, Lifecycle] = {}
    collector = AsyncCollector(
        probe,
        (f"q{i}" for i in itertools.count()),
        buffer,
        lambda: holder["lc"].weight_version,
        cap=InFlightCap(4, 1, samples_per_group=2),
        admit=(lambda: holder["lc"].state is State.GENERATING) if admit_in_generating else None,
        inflight=inflight,
    )
    in_flight_during_training: list[int] = []
    real_train = trainer.train_step

    started_during_training: list[int] = []

    def train_step(batch):  # type: ignore[no-untyped-def]
        in_flight_during_training.append(collector.in_flight + probe.active)
        n0 = collector.stats().started
        time.sleep(0.01)
        started_during_training.append(collector.stats().started - n0)
        return real_train(batch)

    trainer.train_step = train_step  # type: ignore[method-assign]
    lc = Lifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=5),
        drain=drain,
        checkpoint=CheckpointDecision(2),
        validation=ValidationDecision(None),
        checkpoint_extra=lambda: {"replay_buffer": buffer.state_dict(), "collector": collector.state_dict()},
    )
    holder["lc"] = lc
    probe.lc = lc
    metrics = MetricsLogger(tmp_path, tensorboard=False)
    try:
        lc.start()
        while not lc.finished:
            batch = buffer.sample(lc.weight_version, timeout=10)
            assert len(batch) == 4
            assert all(0 <= g.age(lc.weight_version) <= 1 for g in batch)
            result = lc.step(batch)
            metrics.log(
                lc.step_index,
                {**step_metrics(buffer, collector, lc.trace.records)},
                consumed_samples=sum(len(g.samples) for g in batch) or result.consumed_samples,
            )
        lc.stop()
    finally:
        collector.close()
        metrics.close()
    assert lc.state is State.STOPPED and trainer.steps == 5
    assert started_during_training == [0] * 5  # the collector admits nothing while paused
    s = collector.stats()
    assert s.started == s.completed + s.failed + s.deferred + s.in_flight
    if inflight == "drain":
        # rollouts start only while the collector runs: in Generating, or (without ``admit``) in the first
        # actions of Draining, before pause_collector (a rollout admitted in Generating may reach the rollout
        # function just after Draining was entered); they end before the engine is suspended
        starts = {start for start, _, _ in probe.records}
        assert probe.records and starts <= {"Generating", "Draining"}
        assert in_flight_during_training == [0] * 5
        assert all(end in ("Generating", "Draining") for _, end, _ in probe.records)
    assert journal.count("collector", "pause") == 0  # the recording collector is not used here
    # the buffer went into the checkpoints (steps 2 and 4), JSON-able, and restores
    assert [s for s, _, _ in trainer.saves] == [2, 4]
    state = json.loads(json.dumps(trainer.saves[-1][2]["replay_buffer"]))
    restored = ReplayBuffer(4, 1)
    restored.load_state_dict(state)
    assert restored.weight_version == 3 and restored.stats().consumed_groups == 16
    # metrics: consumed samples grow against elapsed wall-clock; buffer and state times recorded
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["train/consumed_samples"] for r in rows] == [8, 16, 24, 32, 40]
    assert all(b["elapsed_s"] > a["elapsed_s"] for a, b in itertools.pairwise(rows))
    assert {"buffer/size", "buffer/avg_age", "buffer/evicted_stale", "time/Training_s"} <= rows[0].keys()
    assert rows[-1]["buffer/evicted_stale"] == 0


def test_state_times_per_step_from_the_trace() -> None:
    _, engine, trainer, collector, drain = recording_adapters()
    trainer.hang_on("train_step", 0.05)
    lc = Lifecycle(
        engine, trainer, collector, config=LifecycleConfig(num_steps=3), drain=drain, checkpoint=CheckpointDecision(2)
    )
    lc.start()
    time.sleep(0.03)  # "waiting for the buffer" in Generating
    for _ in range(3):
        lc.step([0])
        if not lc.finished:
            trainer.hang_on("train_step", 0.05)
    per_step = state_times_per_step(lc.trace.records)
    assert len(per_step) == 3
    assert per_step[0]["Generating"] >= 0.025  # the wait before step 0 belongs to step 0
    assert all(s["Training"] >= 0.045 for s in per_step)
    assert "Checkpointing" in per_step[1] and "Checkpointing" not in per_step[0]
    assert "Waking" in per_step[0] and "Waking" not in per_step[2]  # the last step never wakes
    total = sum(sum(s.values()) for s in per_step)
    recs = lc.trace.records
    assert abs(total - (recs[-1].t_enter - recs[0].t_enter)) < 1e-6
