"""Real Ray on the CPU: control calls under >1000 in-flight rollout calls, the negative control, suspend under
saturation, and a single-controller lifecycle over worker and collector actors."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from colo_fsm import CheckpointDecision, Lifecycle, LifecycleConfig, State  # noqa: E402
from colo_fsm.errors import ConfigError  # noqa: E402
from colo_fsm.guards.capacity import InFlightCap  # noqa: E402
from colo_fsm.ray import (  # noqa: E402
    RayCollectorProxy,
    RayDrain,
    RayEngineProxy,
    RayTextRollout,
    init_ray,
    make_collector_class,
    make_worker_class,
)
from colo_fsm.ray.fakes import HoldingWorkerFactory, numbered_prompts, text_length_reward  # noqa: E402
from colo_fsm.ray.saturation import measure_control_latency, measure_suspend  # noqa: E402
from colo_fsm.testing.fakes import RecordingTrainer  # noqa: E402

HOLD_S = 2.0
ROLLOUTS = 1200  # > 1000 = Ray's default max_concurrency of an asyncio actor


@pytest.fixture(scope="module")
def ray_session():
    init_ray(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def grouped(ray_session):
    w = make_worker_class().remote(0, HoldingWorkerFactory(HOLD_S))
    ray.get(w.bring_up.remote())
    return w


@pytest.fixture(scope="module")
def one_queue(ray_session):
    w = make_worker_class(separate_control_group=False).remote(1, HoldingWorkerFactory(HOLD_S))
    ray.get(w.bring_up.remote())
    return w


def test_control_calls_complete_promptly_under_saturation(grouped) -> None:
    r = measure_control_latency(
        grouped,
        label="group",
        rollout_calls=ROLLOUTS,
        max_concurrency=1000,
        hold_s=HOLD_S,
        control_calls=20,
        probe_active=True,
    )
    assert r.active_at_start == 1000  # saturated: 1000 running, 200 queued
    assert r.completed_rollouts == ROLLOUTS
    # milliseconds in practice; the bound leaves room for a loaded 2-core machine, and is far below HOLD_S
    assert r.p99 < 0.5, r.summary()


def test_negative_control_same_calls_in_the_default_group_queue_behind(one_queue) -> None:
    r = measure_control_latency(
        one_queue, label="one queue", rollout_calls=ROLLOUTS, max_concurrency=1000, hold_s=HOLD_S, control_calls=20
    )
    assert r.completed_rollouts == ROLLOUTS
    # every control call waited for a rollout slot behind the queued rollouts: about the rollouts' hold time
    assert min(r.latencies_s) > 0.5 * HOLD_S * 0.5, r.summary()
    assert r.p50 > 0.5, r.summary()


def test_headroom_keeps_a_one_queue_actor_responsive(one_queue) -> None:
    """For an actor that cannot have a control group: the in-flight cap's headroom keeps rollouts below
    max_concurrency, so control calls find a free slot instead of queueing for a whole rollout. (They still
    share the default group's event loop with the rollouts, so they are slower than in their own group.)"""
    cap = InFlightCap(1000, 1, samples_per_group=1, actor_max_concurrency=1000, control_headroom=8)
    assert cap.value == 992
    r = measure_control_latency(
        one_queue,
        label="headroom",
        rollout_calls=cap.value,
        max_concurrency=1000,
        hold_s=HOLD_S,
        control_calls=8,
        settle_s=0.8,
    )
    assert r.completed_rollouts == cap.value
    assert r.p99 < 0.5 * HOLD_S, r.summary()  # queued behind the rollouts it would be about HOLD_S


def test_suspend_under_saturation_stops_all_rollouts_and_loses_none(grouped) -> None:
    s = measure_suspend(grouped, label="group", rollout_calls=ROLLOUTS, hold_s=HOLD_S)
    assert s.active_after_suspend == 0  # nothing runs while suspended
    assert s.waiting_at_gate > 0  # queued rollouts wait at the gate instead
    assert s.rollouts_failed == 0 and s.rollouts_ok == ROLLOUTS  # none ran mid-handoff, none lost
    assert s.suspend_s < HOLD_S + 1.5  # waits only for the rollouts already running


def test_actor_class_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_concurrency"):
        make_worker_class(max_concurrency=0)
    with pytest.raises(ConfigError, match="control_concurrency"):
        make_collector_class(control_concurrency=0)


def test_single_controller_lifecycle_over_worker_and_collector_actors(ray_session) -> None:
    worker_cls, collector_cls = make_worker_class(), make_collector_class()
    workers = [worker_cls.remote(r, HoldingWorkerFactory(0.01)) for r in range(2)]
    cap = InFlightCap(4, 1, samples_per_group=2, control_headroom=0)  # control calls have their own group
    actor = collector_cls.remote(
        lambda: RayTextRollout(workers, text_length_reward, samples_per_group=2, max_tokens=8),
        numbered_prompts,
        num_prompts_per_step=4,
        max_trajectory_age_steps=1,
        cap=cap,
    )
    holder: dict[str, Lifecycle] = {}
    engine = RayEngineProxy(workers)
    collector = RayCollectorProxy(actor, lambda: holder["lc"].weight_version)
    drain = RayDrain(workers)
    trainer = RecordingTrainer()
    lc = holder["lc"] = Lifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=3),
        drain=drain,
        checkpoint=CheckpointDecision(2),
        checkpoint_extra=lambda: {"replay_buffer": collector.state_dict()},
    )
    lc.start()
    ages = []
    while not lc.finished:
        batch = collector.sample(lc.weight_version, timeout=30)
        assert len(batch) == 4 and all(len(g.samples) == 2 for g in batch)
        ages += [g.age(lc.weight_version) for g in batch]
        lc.step(batch)
    stats = collector.stats()
    lc.stop()
    collector.close()
    assert lc.state is State.STOPPED and trainer.steps == 3
    assert all(0 <= a <= 1 for a in ages) and stats["buffer/evicted_stale"] == 0
    # start 1; step 0: begin + wake = 2; step 1 (saves): begin + save + wake = 3; step 2 (last): begin + done = 2
    assert drain.calls == 8
    assert trainer.saves and "replay_buffer" in trainer.saves[0][2]
    health = ray.get([w.health.remote() for w in workers])
    assert all(h["timed_out"] == 0 and h["gate"] != "open" for h in health)  # torn down, gate closed
    # weight versions seen by the workers' engines advanced with the steps (generation read new weights)
    assert {c.weight_version for g in batch for c in g.samples} <= {1, 2}
