"""The NeMo-RL preset and the declared effects every tool reads: runtime call order, static rules, checker, kit."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import Phase

from colo_fsm.errors import ActionFailed, ConfigError
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states import LIFECYCLE, NEMO_RL, Fact, State, TransitionSpec, resolve_spec
from colo_fsm.states.validate import SpecError, validate_spec
from colo_fsm.testing.checker import check, plan_program, scenarios_for
from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingEngine, recording_adapters
from colo_fsm.testing.lifecycle_machine import Adapters, KitHandle, check_lifecycle, exercise_ranks, recording_fakes
from colo_fsm.testing.profiles import lifecycle_settings

S = State


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


class RecordingBarrier:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def wait(self, *, state=None, weight_version=None) -> None:
        self.journal.add("barrier", "wait")


def _nemo_run(early_stop_at: int, num_steps: int = 10):
    j, engine, trainer, collector, drain = recording_adapters()
    validations: list[tuple[int, int]] = []

    def validator(step: int, wv: int) -> dict[str, float]:
        j.add("validator", "validate")
        validations.append((step, wv))
        return {"accuracy": 0.5 + 0.01 * step}

    lc = Lifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=num_steps, val_at_start=True, val_at_end=True),
        drain=drain,
        barrier=RecordingBarrier(j),
        checkpoint=CheckpointDecision(3),
        validation=ValidationDecision(2),
        early_stop=LatchedDecision("early_stop", lambda step: step == early_stop_at),
        validator=validator,
        spec=NEMO_RL,
    )
    marks: dict[int, int] = {}
    lc.start()
    step = 0
    while not lc.finished:
        marks[step] = len(j.calls)
        lc.step([step, step])
        step += 1
    marks[step] = len(j.calls)
    lc.stop()
    return lc, j, engine, trainer, collector, validations, marks


def test_nemo_rl_ten_steps_exact_call_order_of_a_save_and_validate_step():
    """10 steps, validation every 2, a save every 3, validation at start and end, an early stop on the last step."""
    lc, j, engine, trainer, collector, validations, marks = _nemo_run(early_stop_at=10)  # after 10 steps trained
    assert lc.state is S.STOPPED and lc.weight_version == 10
    # validation at start (step 0, version 0), then every second step, the last one included (val_at_end)
    assert validations == [(0, 0), (2, 2), (4, 4), (6, 6), (8, 8), (10, 10)]
    # saves at steps 2, 5, 8 (every 3) and 9 (the early stop upgrades the last step to save-and-stop)
    assert [(s, wv) for s, wv, _ in trainer.saves] == [(3, 3), (6, 6), (9, 9), (10, 10)]
    # the validation metric of a step that validates and saves is in its checkpoint (validate before save)
    assert trainer.saves[1][2]["validation"] == {"accuracy": 0.5 + 0.01 * 6}
    assert trainer.pending_saves == 0
    # step 5 (index 5: validates, (5+1) % 3 == 0 saves): the whole order, adapter by adapter
    step5 = j.methods()[marks[5] : marks[6]]
    assert step5 == [
        "collector.pause",
        "engine.suspend",
        "device.drain",
        "barrier.wait",
        "trainer.restore_buffers",
        "trainer.train_step",
        "trainer.offload_buffers",
        "device.drain",
        "barrier.wait",
        "engine.resume",  # validation-only wake
        "validator.validate",
        "engine.suspend",  # drained, barriered and suspended before the first checkpoint collective
        "device.drain",
        "barrier.wait",
        "trainer.save_checkpoint",
        "trainer.finalize_checkpoint",  # every collective of the async save done ...
        "device.drain",
        "barrier.wait",
        "engine.resume",  # ... before any wake
        "collector.resume",
    ]
    # the last step validates with the engine woken for validation only: collection never resumes
    last = j.methods()[marks[9] : marks[10]]
    assert "collector.resume" not in last and last.count("engine.resume") == 1
    assert last[-4:] == ["trainer.save_checkpoint", "trainer.finalize_checkpoint", "device.drain", "barrier.wait"]
    # the collector is handed the weight version on every resume (start, then after each step but the last)
    assert collector.versions == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_nemo_rl_early_stop_saves_and_ends_the_run():
    lc, _j, _e, trainer, _c, validations, _m = _nemo_run(early_stop_at=8)  # asked with the steps trained, as validated
    assert lc.weight_version == 8  # steps 0..7 ran; the run stopped after step 7
    assert [(s, wv) for s, wv, _ in trainer.saves] == [(3, 3), (6, 6), (8, 8)]
    assert validations[-1] == (8, 8)


def test_shipped_and_nemo_rl_specs_pass_every_static_rule_and_the_checker():
    validate_spec(LIFECYCLE)
    validate_spec(NEMO_RL)
    assert resolve_spec("nemo_rl") is NEMO_RL and resolve_spec("colo_fsm.states:NEMO_RL") is NEMO_RL
    assert {"val-at-start", "early-stop"} <= set(scenarios_for(NEMO_RL))
    for name in scenarios_for(NEMO_RL):
        assert check(3, spec=NEMO_RL, scenario=name).ok, name


def test_checker_plans_the_nemo_rl_order_from_declared_effects():
    prog = plan_program(NEMO_RL, scenarios_for(NEMO_RL)["all-step-kinds"])
    assert not prog.problems
    ops = [op.action for op in prog.ops if op.step == 3]  # step 3: save + validate
    assert ops.index("resume_engine") < ops.index("latch_early_stop") < ops.index("save_checkpoint")
    assert ops.index("save_checkpoint") < ops.index("finalize_checkpoint") < ops.index("resume_collector")


# ------------------------------------------------------------------------------------------ bad input
def _replace(spec, match, **changes):
    ts = tuple(dataclasses.replace(t, **changes) if match(t) else t for t in spec.transitions)
    return dataclasses.replace(spec, transitions=ts)


def _edge(trigger, source, dest):
    return lambda t: t.trigger == trigger and t.source is source and t.dest is dest


def test_validator_rejects_a_guard_reading_a_fact_no_action_sets():
    acts = tuple(dataclasses.replace(a, sets=()) if a.name == "bump_weight_version" else a for a in LIFECYCLE.actions)
    with pytest.raises(SpecError, match=r"conclude: Training -> .*step_trained, which no action sets"):
        validate_spec(dataclasses.replace(LIFECYCLE, actions=acts))


def test_validator_rejects_a_validation_wake_not_drained_before_the_save():
    spec = _replace(
        NEMO_RL, _edge("conclude", S.CONCLUDING, S.CHECKPOINTING), actions=("suspend_engine", "save_checkpoint")
    )
    with pytest.raises(SpecError) as err:
        validate_spec(spec)
    text = str(err.value)
    assert "Concluding -> Checkpointing" in text and "one-communicator" in text and "validation-only wake" in text


def test_validator_rejects_a_finalize_that_can_be_skipped():
    spec = _replace(NEMO_RL, _edge("conclude", S.CHECKPOINTING, S.DONE), actions=("drain_device", "barrier"))
    with pytest.raises(SpecError, match=r"Checkpointing -> Done.*checkpoint-suspends.*finalize can be skipped"):
        validate_spec(spec)


def test_val_at_start_or_early_stop_need_a_spec_that_has_them():
    _j, engine, trainer, collector, drain = recording_adapters()
    with pytest.raises(ConfigError, match="val_at_start"):
        Lifecycle(engine, trainer, collector, drain=drain, config=LifecycleConfig(val_at_start=True))
    with pytest.raises(ConfigError, match="early_stop"):
        Lifecycle(engine, trainer, collector, drain=drain, early_stop=LatchedDecision("s", lambda s: False))


# ------------------------------------------------------------------------------------------ protocols
class DictTrainer:
    def __init__(self, result):
        self.result = result
        self.torn_down = 0

    def train_step(self, batch):
        return self.result

    def offload_buffers(self): ...
    def restore_buffers(self): ...
    def save_checkpoint(self, step, weight_version, extra_state): ...

    def teardown(self):
        self.torn_down += 1


class TeardownCollector(RecordingCollector):
    torn_down = 0

    def teardown(self):
        self.torn_down += 1


def test_trainer_metrics_from_a_mapping_teardown_in_stop_and_bad_results_typed():
    engine = RecordingEngine()
    trainer, collector = DictTrainer({"loss": 0.25, "consumed_samples": 7}), TeardownCollector()
    lc = Lifecycle(engine, trainer, collector, drain=lambda: None, config=LifecycleConfig(num_steps=2))
    lc.start()
    res = lc.step([1, 2])
    assert res.metrics == {"loss": 0.25} and res.consumed_samples == 7
    trainer.result = {"loss": 0.5}
    assert lc.step([1, 2, 3]).consumed_samples == 3
    lc.stop()
    assert trainer.torn_down == 1 and collector.torn_down == 1
    bad = Lifecycle(RecordingEngine(), DictTrainer(0.5), drain=lambda: None)
    bad.start()
    with pytest.raises(ActionFailed, match="a StepResult, a Mapping of metrics"):
        bad.step([1])
    assert bad.state is S.FAILED


def test_public_save_and_stop_time_rule():
    fired = iter([False, True])
    cd = CheckpointDecision(None, save_and_stop=lambda: next(fired))
    _j, engine, trainer, collector, drain = recording_adapters()
    lc = Lifecycle(engine, trainer, collector, drain=drain, checkpoint=cd)
    lc.start()
    lc.step([0])
    assert lc.state is S.GENERATING and trainer.saves == []
    lc.step([1])
    assert lc.state is S.DONE and [(s, wv) for s, wv, _ in trainer.saves] == [(2, 2)]
    assert cd.decide(1) is True  # latched: asking again does not ask the rule again
    with pytest.raises(ConfigError, match="save_and_stop"):
        CheckpointDecision(1, save_and_stop=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", [LIFECYCLE, NEMO_RL], ids=lambda s: s.name)
def test_save_on_the_last_step_is_a_rule_of_the_checkpoint_decision(spec):
    """NeMo-RL saves at is_last_step: CheckpointDecision(save_on_last_step=True) saves the run's last step (the
    lifecycle tells it num_steps), as well as every save_period steps; no closure over lc.step_index needed."""
    _j, engine, trainer, collector, drain = recording_adapters()
    cd = CheckpointDecision(3, save_on_last_step=True)
    lc = Lifecycle(
        engine, trainer, collector, drain=drain, spec=spec, checkpoint=cd, config=LifecycleConfig(num_steps=5)
    )
    lc.start()
    while not lc.finished:
        lc.step([0])
    lc.stop()
    assert [s for s, _wv, _ in trainer.saves] == [3, 5]  # step indexes 2 (the period) and 4 (the last)
    resumed = CheckpointDecision(10, save_on_last_step=True)  # a resumed run: the last step is num_steps - 1
    _j, engine, trainer, collector, drain = recording_adapters()
    lc = Lifecycle(
        engine, trainer, collector, drain=drain, checkpoint=resumed, config=LifecycleConfig(num_steps=4, start_step=2)
    )
    lc.start()
    while not lc.finished:
        lc.step([0])
    assert [s for s, _wv, _ in trainer.saves] == [4]


def test_resume_refused_with_requests_left_parked():
    class DroppingEngine(RecordingEngine):
        def resume(self):
            super().resume()
            self.parked[99] = 1  # a parked request the resume did not continue

    engine = DroppingEngine()
    lc = Lifecycle(engine, DictTrainer(None), drain=lambda: None)
    lc.start()
    with pytest.raises(ActionFailed, match="left 1 request"):
        lc.step([0])


# ------------------------------------------------------------------------------------------ testing kit
_QUICK = dict(report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate])


def test_kit_runs_the_nemo_rl_preset_with_the_users_batches_barrier_and_validator():
    used = {"batches": 0, "barrier": 0, "validator": 0, "factory_saw_lifecycle": 0}

    class UserBarrier:
        def wait(self, *, state=None, weight_version=None):
            used["barrier"] += 1

    class Batch:
        def __init__(self, trajectories, step):
            self.trajectories, self.step = trajectories, step

        def __len__(self):
            return len(self.trajectories)

    def batch_factory(trajectories, step):
        used["batches"] += 1
        return Batch(trajectories, step)

    def validator(step, weight_version):
        used["validator"] += 1
        return {"reward": 1.0}

    def factory(handle: KitHandle) -> Adapters:
        assert handle.spec is NEMO_RL and handle.lifecycle is None  # set once the machine has built it
        ad = recording_fakes()
        original = ad.trainer.train_step

        def train_step(batch):
            assert isinstance(batch, Batch)
            used["factory_saw_lifecycle"] += handle.lifecycle is not None
            return original(batch)

        ad.trainer.train_step = train_step
        return ad

    check_lifecycle(
        factory,
        settings=lifecycle_settings("colo-fsm-dev", **_QUICK),
        spec=NEMO_RL,
        batch_factory=batch_factory,
        barrier_factory=UserBarrier,
        validator=validator,
    )
    assert all(used.values()), used


class LeakyCollector(RecordingCollector):
    """Its rollouts keep issuing engine work after pause(): they drive decode steps whatever the engine's state."""

    def start_rollout(self):
        if self.engine is None or self.engine.condition in ("absent", "torn_down"):
            return None
        rid = self.engine.submit()
        self.engine.decode_step(force=True)
        return rid


def _leaky() -> Adapters:
    j = Journal()
    engine = RecordingEngine(j)
    return Adapters(engine, recording_fakes().trainer, LeakyCollector(j, engine=engine))


@pytest.mark.parametrize("spec", [LIFECYCLE, NEMO_RL], ids=["lifecycle", "nemo_rl"])
def test_kit_catches_a_collector_issuing_engine_work_during_a_handoff(spec):
    with pytest.raises(AssertionError, match=r"LeakyCollector\.start_rollout delivered a token|decode step"):
        check_lifecycle(_leaky, settings=lifecycle_settings("colo-fsm-dev", **_QUICK), spec=spec, inject_faults=False)


def test_kit_passes_rollouts_parked_in_the_engine():
    check_lifecycle(
        recording_fakes, settings=lifecycle_settings("colo-fsm-dev", **_QUICK), spec=NEMO_RL, inject_faults=False
    )


def test_check_ranks_exercises_the_adapters():
    res = exercise_ranks(recording_fakes, 3, spec=NEMO_RL)
    assert res.ok and res.adapters_exercised and res.adapter_calls > 50, res.summary()
    only_spec = exercise_ranks(None, 2)
    assert only_spec.ok and not only_spec.adapters_exercised and "no adapters were exercised" in only_spec.summary()

    def broken():
        raise RuntimeError("no GPU here")

    with pytest.raises(AssertionError, match="adapter factory raised RuntimeError: no GPU here"):
        exercise_ranks(broken, 2)


def test_transition_spec_roundtrip_is_data():
    """A user's spec is data: renaming an action keeps every tool working, because they read its role."""
    ren = {"save_checkpoint": "persist"}
    acts = tuple(dataclasses.replace(a, name=ren.get(a.name, a.name)) for a in NEMO_RL.actions)
    ts = tuple(
        TransitionSpec(
            t.trigger, t.source, t.dest, tuple(ren.get(a, a) for a in t.actions), t.when, t.unless, t.automatic
        )
        for t in NEMO_RL.transitions
    )
    spec = dataclasses.replace(NEMO_RL, actions=acts, transitions=ts, name="renamed")
    validate_spec(spec)
    assert check(2, spec=spec, scenario="early-stop-saving").ok
    assert Fact.SAVE_PENDING in spec.action("persist").sets
