"""No option silently ignored: each takes effect in the spec it runs, or construction refuses it naming the spec."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from colo_fsm.errors import ActionFailed, ConfigError
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states import LIFECYCLE, NEMO_RL, Fact, State
from colo_fsm.states.validate import validate_spec
from colo_fsm.testing.fakes import RecordingTrainer, recording_adapters

S = State


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _lc(spec=LIFECYCLE, *, trainer=None, **kwargs):
    j, engine, trainer0, collector, drain = recording_adapters()
    return j, Lifecycle(engine, trainer or trainer0, collector, drain=drain, spec=spec, **kwargs)


def _without(spec, state, fact, *actions):
    """``spec`` without ``state`` (and the transitions touching it), ``actions`` and the latched ``fact``: a variant
    lacking a feature."""

    def drop(facts):
        return tuple(f for f in facts if f is not fact)

    return dataclasses.replace(
        spec,
        states=tuple(s for s in spec.states if s.state is not state),
        actions=tuple(dataclasses.replace(a, decides=drop(a.decides)) for a in spec.actions if a.name not in actions),
        transitions=tuple(
            dataclasses.replace(t, when=drop(t.when), unless=drop(t.unless))
            for t in spec.transitions
            if state not in (t.source, t.dest)
        ),
        name=f"no-{state.value.lower()}",
    )


NO_SAVE = _without(LIFECYCLE, S.CHECKPOINTING, Fact.SAVE_THIS_STEP, "save_checkpoint")
NO_VALIDATION = _without(LIFECYCLE, S.VALIDATING, Fact.VALIDATE_THIS_STEP)


def test_val_at_end_on_the_shipped_spec_is_refused_naming_the_spec_and_what_works():
    with pytest.raises(ConfigError) as err:
        _lc(config=LifecycleConfig(num_steps=3, val_at_end=True), validation=ValidationDecision(1))
    text = str(err.value)
    assert "val_at_end=True" in text and "spec lifecycle never wakes it on the last step" in text and "NEMO_RL" in text
    # on NEMO_RL it takes effect: the last step validates
    seen = []
    _j, lc = _lc(
        NEMO_RL,
        config=LifecycleConfig(num_steps=3, val_at_end=True),
        validator=lambda s, w: seen.append(s) or {},
    )
    lc.start()
    while not lc.finished:
        lc.step([0])
    assert seen == [3]


def test_val_at_start_is_refused_on_a_spec_without_it():
    with pytest.raises(ConfigError, match=r"val_at_start=True.*spec lifecycle has none; e.g. NEMO_RL"):
        _lc(config=LifecycleConfig(val_at_start=True))


@pytest.mark.parametrize(
    ("spec", "option", "value", "named"),
    [
        (NO_SAVE, "checkpoint", CheckpointDecision(2), "spec no-checkpointing has none"),
        (NO_SAVE, "checkpoint_extra", lambda: {}, "spec no-checkpointing has none"),
        (NO_VALIDATION, "validator", lambda s, w: {}, "spec no-validating has none"),
        (NO_VALIDATION, "validation", ValidationDecision(2), "spec no-validating has none"),
    ],
)
def test_a_component_the_spec_has_no_place_for_is_refused(spec, option, value, named):
    validate_spec(spec)
    with pytest.raises(ConfigError, match=rf"{option}=.*{named}"):
        _lc(spec, **{option: value})
    _lc(spec)  # without it the variant runs


def test_early_stop_needs_a_run_that_validates():
    stop = LatchedDecision("early_stop", lambda s: True)
    with pytest.raises(ConfigError, match="early_stop=.*this run never validates"):
        _lc(NEMO_RL, early_stop=stop)
    with pytest.raises(ConfigError, match="save_on_early_stop=True: expected an early_stop decision"):
        _lc(NEMO_RL, config=LifecycleConfig(save_on_early_stop=True))


def test_an_early_stop_decided_by_the_validation_at_start_runs_no_step():
    j, lc = _lc(
        NEMO_RL,
        config=LifecycleConfig(num_steps=3, val_at_start=True),
        checkpoint=CheckpointDecision(1),
        validator=lambda s, w: {"reward": 1.0},
        early_stop=LatchedDecision("early_stop", lambda step: step == 0),
    )
    lc.start()
    assert lc.finished and lc.state is S.DONE and lc.step_index == 0
    lc.stop()
    methods = j.methods()
    assert "trainer.train_step" not in methods and "trainer.save_checkpoint" not in methods
    assert "collector.resume" not in methods and methods[-1] == "engine.shutdown"


def _stop_after_two(**kwargs):
    j, lc = _lc(
        NEMO_RL,
        config=LifecycleConfig(num_steps=5, **kwargs.pop("config", {})),
        validation=ValidationDecision(1),
        validator=lambda s, w: {},
        early_stop=LatchedDecision("early_stop", lambda step: step == 2),
        **kwargs,
    )
    lc.start()
    while not lc.finished:
        lc.step([0])
    assert lc.step_index == 2 and lc.state is S.DONE
    return j


def test_an_early_stop_without_checkpointing_does_not_save_unless_asked():
    assert _stop_after_two().count("trainer", "save_checkpoint") == 0
    asked = _stop_after_two(config={"save_on_early_stop": True})
    assert asked.count("trainer", "save_checkpoint") == 1 and asked.count("trainer", "finalize_checkpoint") == 1
    # a run that checkpoints saves the step an early stop ends (every 4: not step 2 on its own)
    assert _stop_after_two(checkpoint=CheckpointDecision(4)).count("trainer", "save_checkpoint") == 1


class DictTrainer(RecordingTrainer):
    def __init__(self, result):
        super().__init__()
        self.result = result

    def train_step(self, batch):
        super().train_step(batch)
        return self.result


def test_a_dict_batch_is_never_counted_by_its_keys():
    batch = {"input_ids": [[1, 2], [3, 4]], "advantages": [0.5, -0.5], "mask": [1, 1], "lengths": [2, 2]}
    _j, lc = _lc(trainer=DictTrainer({"loss": 0.1, "consumed_samples": 2}))
    lc.start()
    assert lc.step(batch).consumed_samples == 2
    _j, lc = _lc(trainer=DictTrainer({"loss": 0.1}))
    lc.start()
    with pytest.raises(ActionFailed, match="'consumed_samples' entry.*the batch is a mapping"):
        lc.step(batch)
    # the recording trainer counts rows, and a list batch is counted by its len
    _j, lc = _lc()
    lc.start()
    assert lc.step(batch).consumed_samples == 2 and lc.step([7, 8, 9]).consumed_samples == 3


class SyncTrainer:
    def train_step(self, batch): ...
    def offload_buffers(self): ...
    def restore_buffers(self): ...
    def save_checkpoint(self, step, weight_version, extra_state): ...


class AsyncTrainerWithoutFinalize(SyncTrainer):
    async_save = True


def test_an_async_save_needs_a_finalize_hook():
    with pytest.raises(ConfigError, match=r"trainer.finalize_checkpoint=None.*spec nemo_rl saves asynchronously"):
        _lc(NEMO_RL, trainer=SyncTrainer())
    with pytest.raises(ConfigError, match=r"trainer.async_save=True.*spec lifecycle saves synchronously"):
        _lc(trainer=AsyncTrainerWithoutFinalize())
    _lc(trainer=SyncTrainer())  # a synchronous save on the shipped spec needs none


def test_demo_server_options_without_serve_are_refused():
    from colo_fsm.demo.config import DemoConfig

    with pytest.raises(ConfigError, match=r"on_policy_guard=True: expected False unless serve=True"):
        DemoConfig(on_policy_guard=True)
    with pytest.raises(ConfigError, match=r"chat_template='roles': expected the default 'digits' unless serve=True"):
        DemoConfig(chat_template="roles")
    assert DemoConfig(serve=True, on_policy_guard=True, chat_template="roles").on_policy_guard
    with pytest.raises(ConfigError, match=r"server_share=0.5: expected the default 0.125 unless serve=True"):
        DemoConfig(server_share=0.5)
    with pytest.raises(ConfigError, match=r"server_share=1.5: expected"):
        DemoConfig(serve=True, server_share=1.5)
    assert DemoConfig(serve=True, server_share=0.5).server_share == 0.5


def test_val_at_start_validates_a_resumed_run_too():
    seen = []
    _j, lc = _lc(
        NEMO_RL,
        config=LifecycleConfig(num_steps=6, start_step=4, start_weight_version=4, val_at_start=True),
        validator=lambda s, w: seen.append((s, w)) or {},
    )
    lc.start()
    assert seen == [(4, 4)] and lc.state is S.GENERATING


def _validates_only_after_a_save():
    """A variant whose validation-only wake is gone: a step decided to validate (and not to save) goes on to Waking."""
    F = Fact
    ts = []
    for t in LIFECYCLE.transitions:
        if t.trigger == "conclude" and t.source is S.TRAINING and t.dest is S.VALIDATING:
            continue
        if t.trigger == "conclude" and t.source is S.TRAINING and t.dest is S.WAKING:
            t = dataclasses.replace(t, unless=(F.SAVE_THIS_STEP, F.LAST_STEP))
        ts.append(t)
    return dataclasses.replace(LIFECYCLE, transitions=tuple(ts), name="validates-after-saves")


def test_a_validation_decision_the_spec_can_never_fire_is_refused_naming_the_path():
    variant = _validates_only_after_a_save()
    validate_spec(variant)  # a well-formed spec: it validates after a save
    with pytest.raises(ConfigError) as err:
        _lc(variant, config=LifecycleConfig(num_steps=12), validation=ValidationDecision(3))
    msg = str(err.value)
    assert msg.startswith("validation=") and "validates-after-saves" in msg, msg
    assert "Generating -> Draining -> Training -> Waking -> Generating" in msg and "never validate" in msg, msg
    _lc(variant, config=LifecycleConfig(num_steps=12), validation=ValidationDecision(None))  # off on purpose: fine


def test_a_hook_without_its_decision_is_refused():
    with pytest.raises(ConfigError, match=r"^validator=.*never called"):
        _lc(validator=lambda s, w: {})
    _lc(validator=lambda s, w: {}, validation=ValidationDecision(2))
    _lc(validator=lambda s, w: {}, validation=ValidationDecision(None))  # an explicit "never" (a config's period)
    with pytest.raises(ConfigError, match=r"^checkpoint_extra=.*never called"):
        _lc(checkpoint_extra=dict)
    _lc(checkpoint_extra=dict, checkpoint=CheckpointDecision(2))


def test_components_the_run_cannot_use_are_refused():
    import threading

    from colo_fsm.guards.barrier import SoloBarrier, ThreadBarrier

    with pytest.raises(ConfigError, match=r"^config.world_size=1: expected the 2 ranks the barrier spans"):
        _lc(barrier=ThreadBarrier(threading.Barrier(2), 0))
    with pytest.raises(ConfigError, match=r"^config.world_size=2: expected the 1 ranks"):
        _lc(barrier=SoloBarrier(), config=LifecycleConfig(world_size=2))
    with pytest.raises(ConfigError, match=r"^data_parallel_rank=1: expected an engine that reports its sampling"):
        _lc(config=LifecycleConfig(data_parallel_rank=1))
    with pytest.raises(ConfigError, match=r"^checkpoint.save_on_last_step=True: expected a run with num_steps"):
        _lc(checkpoint=CheckpointDecision(save_on_last_step=True))


def test_the_time_rule_agreement_error_names_only_the_rule_that_was_set():
    import threading

    from colo_fsm.guards.barrier import ThreadBarrier

    barrier = ThreadBarrier(threading.Barrier(2), 0)
    cfg = LifecycleConfig(world_size=2)
    with pytest.raises(ConfigError) as err:
        _lc(barrier=barrier, config=cfg, checkpoint=CheckpointDecision(save_and_stop=lambda: False))
    assert "a save_and_stop time rule" in str(err.value) and "must_save_by_s" not in str(err.value), err.value
    with pytest.raises(ConfigError) as err:
        _lc(barrier=barrier, config=cfg, checkpoint=CheckpointDecision(must_save_by_s=60))
    assert "a must_save_by_s time rule" in str(err.value) and "save_and_stop" not in str(err.value), err.value
