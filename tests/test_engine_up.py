"""An engine that is up at construction (NeMo-RL's MegatronGeneration): declared in the spec, adopted by start,
and a mismatch between what the engine reports (its plain ``condition``, the simple form of the one engine-state
report) and what the state declares refused by the runtime itself with ``EngineStateMismatch``."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import Phase

import colo_fsm
from colo_fsm import diagram
from colo_fsm.errors import ConditionMismatch, ConfigError, EngineStateMismatch, SpecError
from colo_fsm.guards.engine_state import EngineStateReport, engine_state_of
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states import LIFECYCLE, NEMO_RL, NEMO_RL_ENGINE_UP, State, engine_at_construction, resolve_spec
from colo_fsm.states.validate import validate_spec
from colo_fsm.testing.checker import check, scenarios_for
from colo_fsm.testing.fakes import (
    Journal,
    RecordingCollector,
    RecordingDrain,
    RecordingEngine,
    RecordingTrainer,
    recording_adapters,
)
from colo_fsm.testing.lifecycle_machine import check_lifecycle, recording_fakes
from colo_fsm.testing.profiles import lifecycle_settings

S = State
_QUICK = dict(report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate], max_examples=40)


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def test_the_spec_declares_it_and_start_adopts_the_engine_building_nothing():
    spec = NEMO_RL_ENGINE_UP
    assert resolve_spec("nemo_rl_engine_up") is spec and spec.engine_up_at_construction
    assert not NEMO_RL.engine_up_at_construction and engine_at_construction(spec) is spec
    assert spec.state(S.CREATED).engine.value == "awake"
    start = spec.select(S.CREATED, "start", {})
    assert start is not None and start.actions[0] == "adopt_engine" and "build_engine" not in start.actions
    j, engine, trainer, collector, drain = recording_adapters(engine_up=True, urls=["http://10.0.0.1:8000/v1"])
    lc = Lifecycle(engine, trainer, collector, drain=drain, spec=spec, config=LifecycleConfig(num_steps=2))
    assert lc.engine_condition.value == "awake"
    lc.start()
    assert lc.state is S.GENERATING and lc.dp_openai_server_base_urls == ["http://10.0.0.1:8000/v1"]
    while not lc.finished:
        lc.step([0, 1])
    lc.stop()
    assert j.count("engine", "bring_up") == 0 and engine.builds == 0 and engine.condition == "torn_down"


def test_the_checker_and_the_diagram_know_the_difference():
    for name in scenarios_for(NEMO_RL_ENGINE_UP):
        assert check(2, spec=NEMO_RL_ENGINE_UP, scenario=name).ok, name
    text = diagram.diagram_text("mermaid", NEMO_RL_ENGINE_UP)
    assert "Created : engine awake" in text and "adopt_engine" in text and "build_engine" not in text
    assert "Created : engine absent" in diagram.diagram_text("mermaid", NEMO_RL)


def test_stopping_before_start_tears_down_the_engine_that_came_up_at_construction():
    j, engine, trainer, collector, drain = recording_adapters(engine_up=True)
    lc = Lifecycle(engine, trainer, collector, drain=drain, spec=NEMO_RL_ENGINE_UP)
    lc.stop()
    assert lc.state is S.STOPPED and engine.condition == "torn_down" and j.count("engine", "shutdown") == 1


def test_start_refuses_an_engine_up_at_construction_on_a_spec_that_builds_it():
    j, engine, trainer, collector, drain = recording_adapters(engine_up=True)
    lc = Lifecycle(engine, trainer, collector, drain=drain, spec=NEMO_RL)
    with pytest.raises(EngineStateMismatch) as err:
        lc.start()
    e, text = err.value, str(err.value)
    assert (e.lifecycle_state, e.expected, e.engine_state, e.when) == ("Created", "absent", "awake", "at start")
    assert "lifecycle state Created expects the engine absent, but RecordingEngine reports awake" in text
    assert "engine_at_construction" in text
    assert lc.state is S.CREATED and j.calls == []  # refused before anything ran


def test_start_refuses_an_engine_not_up_on_a_spec_that_adopts_it():
    j, engine, trainer, collector, drain = recording_adapters()
    lc = Lifecycle(engine, trainer, collector, drain=drain, spec=NEMO_RL_ENGINE_UP)
    with pytest.raises(EngineStateMismatch, match=r"at start: lifecycle state Created expects the engine awake, but "):
        lc.start()
    assert lc.state is S.CREATED and j.calls == []


class SilentEngine(RecordingEngine):
    """An engine that reports nothing about its condition."""

    def __getattribute__(self, name):
        if name == "condition":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_a_spec_that_adopts_needs_an_engine_that_reports_its_condition():
    _j, _e, trainer, collector, drain = recording_adapters()
    with pytest.raises(ConfigError, match=r"engine.condition.*nemo_rl_engine_up declares the engine up"):
        Lifecycle(SilentEngine(up=True), trainer, collector, drain=drain, spec=NEMO_RL_ENGINE_UP)


class StaysAwakeEngine(RecordingEngine):
    """Its suspend returns but the engine keeps decoding (reports awake)."""

    def suspend(self):
        self._call("suspend")


def test_the_runtime_refuses_a_mismatch_at_a_handoff_naming_both():
    j, _e, trainer, collector, drain = recording_adapters()
    engine = StaysAwakeEngine(j)
    lc = Lifecycle(engine, trainer, collector, drain=drain, config=LifecycleConfig(num_steps=3))
    lc.start()
    with pytest.raises(EngineStateMismatch) as err:
        lc.step([0])
    e = err.value
    assert (e.lifecycle_state, e.expected, e.engine_state, e.when) == (
        "Draining",
        "suspended",
        "awake",
        "after suspend_engine",
    )
    assert "lifecycle state Draining expects the engine suspended, but StaysAwakeEngine reports awake" in str(e)
    assert lc.state is S.FAILED and lc.failure is err.value
    assert "trainer.train_step" not in j.methods()  # refused before the training step


def test_validate_spec_refuses_a_build_in_a_spec_whose_engine_is_up_at_construction():
    up = engine_at_construction(LIFECYCLE)
    validate_spec(up)
    ts = tuple(
        dataclasses.replace(t, actions=("build_engine", *t.actions[1:])) if t.trigger == "start" else t
        for t in up.transitions
    )
    acts = (*up.actions, LIFECYCLE.action("build_engine"))
    with pytest.raises(SpecError, match=r"build_engine: Created declares the engine awake"):
        validate_spec(dataclasses.replace(up, transitions=ts, actions=acts))


def test_the_kit_runs_a_spec_that_adopts_and_catches_an_adapter_that_does_not_match():
    check_lifecycle(settings=lifecycle_settings("colo-fsm-dev", **_QUICK), spec=NEMO_RL_ENGINE_UP)
    with pytest.raises(AssertionError, match="engine reports absent"):
        check_lifecycle(recording_fakes, settings=lifecycle_settings("colo-fsm-dev", **_QUICK), spec=NEMO_RL_ENGINE_UP)


def test_one_error_for_both_forms_importable_from_the_package():
    assert colo_fsm.EngineStateMismatch is EngineStateMismatch is ConditionMismatch  # the old name: an alias
    assert "EngineStateMismatch" in colo_fsm.__all__ and colo_fsm.EngineStateReport is not None


class RichReportEngine(RecordingEngine):
    """Reports the rich form too (a native state machine); ``engine_state()`` wins over ``condition``."""

    def engine_state(self):
        native = {"awake": "RUNNING", "suspended": "SUSPENDED", "torn_down": "STOPPED"}.get(self.condition)
        if native is None:
            return None
        from colo_fsm.states.spec import EngineCondition

        return EngineStateReport(native, EngineCondition(self.condition), "toy", {EngineCondition.AWAKE: ("RUNNING",)})


def test_both_forms_are_one_report_checked_at_start_and_at_every_action_and_traced():
    for engine_cls, awake in ((RecordingEngine, "awake"), (RichReportEngine, "RUNNING")):
        j = Journal()
        engine = engine_cls(j, up=True)
        trainer, collector, drain = RecordingTrainer(j), RecordingCollector(j, engine=engine), RecordingDrain(j)
        lc = Lifecycle(engine, trainer, collector, drain=drain, spec=NEMO_RL_ENGINE_UP, config=LifecycleConfig())
        lc.start()
        assert {r.dest: r.engine_state for r in lc.trace.records}["Generating"] == awake
        engine.condition = "suspended"  # behind the lifecycle's back
        with pytest.raises(EngineStateMismatch, match=r"before \w+: lifecycle state \w+ expects the engine awake"):
            lc.step([0])
        assert lc.state is S.FAILED and lc.failure is not None and "trainer.train_step" not in j.methods()


def test_a_condition_that_is_no_condition_is_a_config_error_naming_it():
    engine = RecordingEngine()
    engine.condition = "sleeping"
    with pytest.raises(ConfigError, match=r"RecordingEngine.condition.*'sleeping'.*awake"):
        engine_state_of(engine)


def test_stopping_before_start_on_a_spec_that_builds_accepts_an_engine_still_absent():
    j, engine, trainer, collector, drain = recording_adapters()
    lc = Lifecycle(engine, trainer, collector, drain=drain, spec=NEMO_RL)
    refused = None
    try:
        lc.stop()  # declared torn down; the engine, never built, still reports absent: no mismatch
    except EngineStateMismatch as exc:
        refused = exc
    assert refused is None, refused
    assert lc.state is S.STOPPED and lc.failure is None and engine.condition == "absent"
    assert j.count("engine", "shutdown") == 0
