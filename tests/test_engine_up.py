"""An engine that is up at construction (NeMo-RL's MegatronGeneration): declared in the spec, adopted by start,
and a mismatch between what the engine reports and what the state declares refused by the runtime itself."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import Phase

from colo_fsm import diagram
from colo_fsm.errors import ConditionMismatch, ConfigError, SpecError
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states import LIFECYCLE, NEMO_RL, NEMO_RL_ENGINE_UP, State, engine_at_construction, resolve_spec
from colo_fsm.states.validate import validate_spec
from colo_fsm.testing.checker import check, scenarios_for
from colo_fsm.testing.fakes import RecordingEngine, recording_adapters
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
    with pytest.raises(ConditionMismatch) as err:
        lc.start()
    text = str(err.value)
    assert "engine reports awake" in text and "declares absent (Created)" in text and "engine_at_construction" in text
    assert lc.state is S.CREATED and j.calls == []  # refused before anything ran


def test_start_refuses_an_engine_not_up_on_a_spec_that_adopts_it():
    j, engine, trainer, collector, drain = recording_adapters()
    lc = Lifecycle(engine, trainer, collector, drain=drain, spec=NEMO_RL_ENGINE_UP)
    with pytest.raises(ConditionMismatch, match=r"engine reports absent.*declares awake \(Created\)"):
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
    with pytest.raises(ConditionMismatch) as err:
        lc.step([0])
    assert "engine reports awake, the lifecycle declares suspended (Draining) at the handoff barrier" in str(err.value)
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
