"""Real Ray on the CPU: control and training calls under >1000 in-flight rollout calls (against the negative
control of one shared queue), suspend under saturation, the engine proxy reporting the workers' own
``reads_weights_in_place``, and a single-controller lifecycle over colocated worker actors (engine and
trainer of each rank in the worker's process) and the collector actor.

No assertion compares two wall-clock figures (a loaded machine slows both sides differently): each says what
ran before what, as counts the actor reports when a control call runs (rollouts started and finished), against
the negative control of the same calls on an actor with one shared queue.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")

from colo_fsm import CheckpointDecision, Lifecycle, LifecycleConfig, State  # noqa: E402
from colo_fsm.adapters.protocols import StepResult, Trainer  # noqa: E402
from colo_fsm.errors import ConfigError, LifecycleError, UnsupportedEngine  # noqa: E402
from colo_fsm.guards.capacity import InFlightCap  # noqa: E402
from colo_fsm.ray import (  # noqa: E402
    RayCollectorProxy,
    RayDrain,
    RayEngineProxy,
    RayTextRollout,
    RayTrainerProxy,
    combine_step_results,
    init_ray,
    make_collector_class,
    make_worker_class,
    replicate_batch,
    split_batch,
)
from colo_fsm.ray.actors import rank_local  # noqa: E402
from colo_fsm.ray.fakes import HoldingWorkerFactory, numbered_prompts, text_length_reward  # noqa: E402
from tests.support import saturation  # noqa: E402
from tests.support.saturation import (  # noqa: E402
    HeldWorkerFactory,
    Release,
    measure_control_latency,
    measure_suspend,
    measure_training_step,
)

HOLD_S = 2.0
# How long a measurement's calls may take to come back at all: a bound on liveness, never compared with a figure.
# The calls queue behind 1,200 rollout calls by design, so their time grows with the machine's load: at load 11 on
# two cores a run passed 60 s (the negative control's health calls, 2026-12-06).
CALLS_BACK_S = 300.0
ROLLOUTS = 1200  # > 1000 = Ray's default max_concurrency of an asyncio actor
MAX_CONCURRENCY = 1000


@pytest.fixture(scope="module")
def ray_session():
    # one local cluster for every Ray module of the session (tests/conftest.py shuts it down at the end)
    init_ray(num_cpus=2, include_dashboard=False)


@pytest.fixture(scope="module")
def release(ray_session):
    """What the rollouts of both workers wait for: sent by the test, so "before" and "after" are orders."""
    return Release.remote()


@pytest.fixture(scope="module")
def grouped(ray_session, release):
    w = make_worker_class().remote(0, HeldWorkerFactory(release))
    ray.get(w.bring_up.remote())
    return w


@pytest.fixture(scope="module")
def one_queue(ray_session, release):
    # a rollout waiting at the closed gate gives up after HOLD_S (instead of the default 300 s), so a control
    # call queued behind rollouts parked at the gate completes, late, instead of hanging the negative control
    w = make_worker_class(separate_control_group=False).remote(1, HeldWorkerFactory(release), request_timeout_s=HOLD_S)
    ray.get(w.bring_up.remote())
    return w


@pytest.fixture(scope="module")
def negative_control(one_queue, release):
    """The same control calls on the one-queue actor while its rollouts are held: the reference the grouped
    actor is compared with."""
    r = measure_control_latency(
        one_queue,
        label="one queue",
        rollout_calls=ROLLOUTS,
        max_concurrency=MAX_CONCURRENCY,
        hold_s=0.0,
        control_calls=20,
        control_method="health",
        release=release,
        wait_before_release_s=1.0,
        timeout_s=CALLS_BACK_S,
    )
    assert r.completed_rollouts == ROLLOUTS
    return r


def test_negative_control_same_calls_in_the_default_group_queue_behind(negative_control) -> None:
    r = negative_control
    # none returned while the rollouts were held: they queued behind them ...
    assert r.returned_before_release == 0
    # ... and ran only after the 200 rollouts queued before them had taken freed slots (counts, not times)
    assert len(r.completed_seen) == 20 and min(r.completed_seen) >= ROLLOUTS - MAX_CONCURRENCY, r.completed_seen


def test_control_calls_complete_promptly_under_saturation(grouped, negative_control, release) -> None:
    r = measure_control_latency(
        grouped,
        label="group",
        rollout_calls=ROLLOUTS,
        max_concurrency=MAX_CONCURRENCY,
        hold_s=0.0,
        control_calls=20,
        control_method="health",
        probe_active=True,
        release=release,
        timeout_s=CALLS_BACK_S,
    )
    assert r.active_at_start == MAX_CONCURRENCY  # saturated: 1000 running (held), 200 queued
    assert r.completed_rollouts == ROLLOUTS
    # every control call returned while all rollouts were held, none finished, the queued 200 not started:
    # the calls did not queue behind them (the negative control's returned none)
    assert r.returned_before_release == 20 > negative_control.returned_before_release
    assert r.completed_seen == [0] * 20 and r.calls_seen == [MAX_CONCURRENCY] * 20, (r.completed_seen, r.calls_seen)


def test_headroom_keeps_a_one_queue_actor_responsive(one_queue, negative_control, release) -> None:
    """For an actor that cannot have a control group: the in-flight cap's headroom keeps rollouts below
    max_concurrency, so control calls find a free slot instead of queueing for a whole rollout."""
    cap = InFlightCap(1000, 1, samples_per_group=1, actor_max_concurrency=MAX_CONCURRENCY, control_headroom=8)
    assert cap.value == 992
    r = measure_control_latency(
        one_queue,
        label="headroom",
        rollout_calls=cap.value,
        max_concurrency=MAX_CONCURRENCY,
        hold_s=0.0,
        control_calls=8,
        control_method="health",
        settle_s=0.8,
        release=release,
        timeout_s=CALLS_BACK_S,
    )
    assert r.completed_rollouts == cap.value
    # every control call returned while all 992 rollouts were held (none had finished), unlike the
    # negative control's, which waited for rollouts to finish
    assert r.returned_before_release == 8 and r.completed_seen == [0] * 8, r.completed_seen
    assert negative_control.returned_before_release == 0


def test_suspend_under_saturation_stops_all_rollouts_and_loses_none(grouped, release) -> None:
    s = measure_suspend(grouped, label="group", rollout_calls=ROLLOUTS, hold_s=0.0, release=release)
    assert s.active_after_suspend == 0  # nothing runs while suspended
    assert s.rollouts_failed == 0 and s.rollouts_ok == ROLLOUTS  # none ran mid-handoff, none lost
    # the suspend closed the gate while 1000 rollouts ran (held) and 200 queued; it waited for exactly the
    # running ones: none of the queued 200 ran before it (in one shared queue they would have, being first)
    assert s.completed_at_suspend == MAX_CONCURRENCY, s
    assert s.completed_at_suspend + s.waiting_at_gate == s.calls_at_suspend, s  # the rest wait at the gate


def test_the_suspend_snapshot_waits_out_a_call_counted_but_not_yet_at_the_gate(monkeypatch) -> None:
    """Forced: ``health`` (the control group's thread) can read a rollout call counted on arrival but not yet
    waiting at the gate (1,120 calls, 1,000 done, 119 waiting: a busy machine's CI caught it), or one past the gate
    not yet counted finished. The snapshot the suspend test asserts on is the first read in which every call that
    can arrive has and each is finished, waiting or running: no time window, so no pace of the machine moves it."""
    first = {"calls": 1120, "completed": 1000, "waiting": 119, "active": 0}  # not all arrived, one in between
    late = {"calls": 1200, "completed": 1000, "waiting": 199, "active": 0}  # all arrived, one not yet at the gate
    leaving = {"calls": 1200, "completed": 999, "waiting": 200, "active": 0}  # one past the gate, not yet finished
    settled = {"calls": 1200, "completed": 1000, "waiting": 200, "active": 0}
    reads = [first, late, leaving, settled, {"calls": -1}]

    class Worker:
        class health:
            @staticmethod
            def remote() -> dict:
                return reads.pop(0)

    monkeypatch.setattr(saturation, "ray", SimpleNamespace(get=lambda ref, timeout=None: ref))
    monkeypatch.setattr(saturation, "time", SimpleNamespace(sleep=lambda s: None, monotonic=lambda: 0.0))
    health = saturation._settled_health(Worker(), 0, 0, 1200, 1000, deadline=float("inf"))
    assert health == settled and reads == [{"calls": -1}]  # the first settled read, no more
    # a call still running while suspended is accounted for, so the snapshot settles and shows it (the suspend
    # test then fails on active_after_suspend), rather than waiting for it
    reads[:] = [{"calls": 1200, "completed": 1000, "waiting": 199, "active": 1}]
    assert saturation._settled_health(Worker(), 0, 0, 1200, 1000, deadline=float("inf"))["active"] == 1


def test_training_step_under_saturation_runs_at_once(grouped, one_queue, release) -> None:
    """A training step is a control call: with >1000 rollout calls waiting for the suspended engine (all
    max_concurrency slots taken), it still runs at once. In one shared queue it waits for those slots, i.e.
    until the parked rollouts give up at the gate."""
    ray.get(release.send.remote())  # rollouts here wait at the gate, not for the release
    batch = [f"sample{i}" for i in range(4)]
    g = measure_training_step(grouped, batch, label="group", rollout_calls=ROLLOUTS, probe_parked=MAX_CONCURRENCY)
    assert g.parked_at_start == MAX_CONCURRENCY  # every default-group slot held by a parked rollout
    assert g.rollouts_failed == 0 and g.rollouts_ok == ROLLOUTS  # all ran after the resume
    # the negative control waits by design: behind 1,200 queued rollout calls, each started and then timed out at the
    # gate, so its time grows with the machine's load (a loaded CI run took past 60 s); its bound is a generous 300 s
    neg = measure_training_step(one_queue, batch, label="one queue", rollout_calls=ROLLOUTS, timeout_s=300.0)
    # the one queue's step waited for the parked rollouts to time out; the grouped one did not (none failed)
    assert neg.rollouts_failed > 0
    assert ray.get(grouped.health.remote())["train_steps"] >= 1


def test_worker_refuses_training_while_its_engine_is_awake(grouped) -> None:
    assert ray.get(grouped.health.remote())["gate"] == "open"
    with pytest.raises(LifecycleError, match="not suspended"):
        ray.get(grouped.train_step.remote(["x"]))


def test_actor_class_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_concurrency"):
        make_worker_class(max_concurrency=0)
    with pytest.raises(ConfigError, match="control_concurrency"):
        make_collector_class(control_concurrency=0)


def test_bad_local_rank_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "gpu1")
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        rank_local()
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert rank_local() == 3


def test_batch_sharding_and_result_combining() -> None:
    batch = list(range(7))
    shards = [split_batch(batch, r, 3) for r in range(3)]
    assert shards == [[0, 1, 2], [3, 4], [5, 6]]
    assert replicate_batch(batch, 2, 3) is batch
    with pytest.raises(ConfigError, match="batch"):
        split_batch([1], 0, 2)
    with pytest.raises(ConfigError, match="batch"):
        split_batch({"not": "a sequence"}, 0, 2)
    out = combine_step_results(
        [StepResult({"loss": 1.0, "a": 2.0}, 3), StepResult({"loss": 3.0}, 4)],
    )
    assert out.metrics == {"loss": 2.0, "a": 2.0} and out.consumed_samples == 7


def test_engine_proxy_reports_the_workers_refit_flag(ray_session, grouped) -> None:
    refit = make_worker_class().remote(7, HoldingWorkerFactory(reads_weights_in_place=False, trainer=False))
    try:
        proxy = RayEngineProxy([refit])
        assert proxy.reads_weights_in_place is False
        with pytest.raises(UnsupportedEngine, match="reads_weights_in_place"):
            Lifecycle(proxy, RayTrainerProxy([grouped]))
        # the same engine is accepted when the run is synchronous (weights refit in the trainer's offload)
        Lifecycle(proxy, RayTrainerProxy([grouped]), config=LifecycleConfig(async_training=False))
        with pytest.raises(ConfigError, match="workers.reads_weights_in_place") as info:
            RayEngineProxy([grouped, refit])
        assert info.value.value["True"][0].startswith("worker 0 (rank 0, FakeEngine")
        assert info.value.value["False"][0].startswith("worker 1 (rank 7, FakeEngine")
        with pytest.raises(ConfigError, match="workers.trainer") as info:
            RayTrainerProxy([refit])
        assert info.value.value["without a trainer"][0].startswith("worker 0 (rank 7,")
    finally:
        ray.kill(refit)


def _merge_check_barrier(logs: list[list[dict]]) -> list[str]:
    """Every worker ran the same lifecycle calls in the same order, and every call on every worker started
    only after every worker had finished the previous one (the driver's gather is the barrier)."""
    names = [[e["call"] for e in log] for log in logs]
    assert all(n == names[0] for n in names), names
    assert all(e["ok"] and e["end"] is not None for log in logs for e in log)
    for j in range(1, len(names[0])):
        started = min(log[j]["start"] for log in logs)
        previous_done = max(log[j - 1]["end"] for log in logs)
        assert started >= previous_done, (j, names[0][j - 1], names[0][j])
    return names[0]


def test_single_controller_lifecycle_over_colocated_workers_and_collector(ray_session, tmp_path) -> None:
    worker_cls, collector_cls = make_worker_class(), make_collector_class()
    ckpt = str(tmp_path / "ckpt")
    workers = [worker_cls.remote(r, HoldingWorkerFactory(0.01, checkpoint_dir=ckpt)) for r in range(2)]
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
    trainer = RayTrainerProxy(workers)
    assert isinstance(trainer, Trainer) and engine.reads_weights_in_place is True
    collector = RayCollectorProxy(actor, lambda: holder["lc"].weight_version)
    drain = RayDrain(workers)
    lc = holder["lc"] = Lifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=3),
        drain=drain,
        checkpoint=CheckpointDecision(2),
        checkpoint_extra=lambda: saved_extra.append({"replay_buffer": collector.state_dict()}) or saved_extra[-1],
    )
    saved_extra: list[dict] = []
    lc.start()
    batches = []
    while not lc.finished:
        batch = collector.sample(lc.weight_version, timeout=30)
        assert len(batch) == 4 and all(len(g.samples) == 2 for g in batch)
        batches.append((lc.weight_version, batch))
        lc.step(batch)
        # each worker trained on its own half of the batch; metrics averaged, samples summed
        assert [r.consumed_samples for r in trainer.last_results] == [2, 2]
        assert lc.last_result is not None and lc.last_result.consumed_samples == 4
        assert lc.last_result.metrics["train/rank"] == 0.5  # mean of ranks 0 and 1
    stats = collector.stats()
    lc.stop()
    collector.close()
    assert lc.state is State.STOPPED and lc.weight_version == 3
    assert stats["buffer/evicted_stale"] == 0
    for version, batch in batches:
        for g in batch:
            assert 0 <= g.age(version) <= 1
            # generation read the weights the workers' trainers wrote in place: every completion was stamped
            # by a worker's engine with its model's version; the collector parks on pause, so a group's samples
            # may come from the version at its start and the next one (the group spans oldest..newest)
            stamps = {c.weight_version for c in g.samples}
            assert min(stamps) == g.weight_version and max(stamps) <= g.newest_version <= g.weight_version + 1, g
    assert {g.weight_version for _, b in batches[1:] for g in b} & {1, 2}  # new weights were generated from
    # start 1; step 0: begin + wake = 2; step 1 (saves): begin + save + wake = 3; step 2 (last): begin + done = 2
    assert drain.calls == 8

    infos = ray.get([w.info.remote() for w in workers])
    health = ray.get([w.health.remote() for w in workers])
    pids = [i["pid"] for i in infos]
    assert len(set(pids)) == 2 and os.getpid() not in pids  # two worker processes, not the driver
    assert [h["train_steps"] for h in health] == [3, 3] and [h["saves"] for h in health] == [1, 1]
    assert all(h["gate"] != "open" for h in health)  # torn down, gate closed
    # the collector parks on pause: calls held at a worker's gate through the last handoff (the last step never
    # wakes the engine) are refused at the teardown, never admitted; at most one per sample of the groups in flight
    assert sum(h["timed_out"] for h in health) <= cap.value * 2
    for rank, pid in enumerate(pids):  # each rank saved its own part, from its own process
        saved = json.loads((tmp_path / "ckpt" / f"rank{rank}-step2.json").read_text())
        assert saved["pid"] == pid and saved["weight_version"] == 2 and saved["model_version"] == 2
        assert "replay_buffer" in saved["extra_state"]
        # the collector's state carries the buffer AND the prompts deferred on pause (none lost on resume)
        assert set(saved_extra[0]["replay_buffer"]) == {"buffer", "collector"}

    calls = _merge_check_barrier(ray.get([w.control_log.remote() for w in workers]))
    handoff = ["suspend", "drain", "restore_buffers", "train_step", "offload_buffers", "drain"]
    assert calls == [
        *["bring_up", "drain"],
        *handoff,
        "resume",
        *handoff,
        *["save_checkpoint", "drain", "resume"],
        *handoff,
        "shutdown",
    ]


class _Model:
    pass


class _ModelEngine:
    reads_weights_in_place = True

    def __init__(self, model: object) -> None:
        self.model = model

    def bring_up(self) -> None: ...
    def suspend(self) -> None: ...
    def resume(self) -> None: ...
    def shutdown(self) -> None: ...
    def server_base_urls(self) -> list[str]:
        return []

    def generate(self, prompts, *, max_tokens, temperature=0.0, seed=None):  # type: ignore[no-untyped-def]
        return []


class _ModelTrainer:
    def __init__(self, model: object) -> None:
        self.model = model

    def train_step(self, batch: object) -> StepResult:
        return StepResult()

    def offload_buffers(self) -> None: ...
    def restore_buffers(self) -> None: ...
    def save_checkpoint(self, step: int, weight_version: int, extra_state: object) -> None: ...


def test_worker_adapters_are_checked_in_process() -> None:
    """The worker body (no Ray needed) builds engine and trainer through the factory and checks them."""
    from colo_fsm.ray import ColocatedFactory, RolloutWorkerBody, WorkerAdapters

    body = RolloutWorkerBody(0, ColocatedFactory(lambda r: _Model(), lambda m, r: _ModelEngine(m), _trainer_on))
    assert body.trainer is not None and body.trainer.model is body.gated.inner.model  # one model object
    assert body.gated.generator is body.gated.inner  # the engine generates text itself
    with pytest.raises(ConfigError, match="same model object"):
        RolloutWorkerBody(0, lambda r: WorkerAdapters(_ModelEngine(_Model()), _ModelTrainer(_Model())))
    with pytest.raises(ConfigError, match="adapters_factory"):
        RolloutWorkerBody(0, lambda r: _ModelEngine(_Model()))
    with pytest.raises(ConfigError, match="trainer"):
        RolloutWorkerBody(0, lambda r: WorkerAdapters(_ModelEngine(_Model()), object()))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="make_trainer"):
        ColocatedFactory(_Model, _ModelEngine, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="shard"):
        RayTrainerProxy([object()], shard=None)  # type: ignore[arg-type]


def _trainer_on(model: object, rank: int) -> _ModelTrainer:
    return _ModelTrainer(model)
