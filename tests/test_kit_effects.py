"""The kit judges what the engine does, not what it says: decodes counted by their cause and charged where they ran,
and tokens time-stamped against the lifecycle's own windows (item 1 of issue 27)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from colo_fsm.guards.decision import LatchedDecision, ValidationDecision
from colo_fsm.states import NEMO_RL, State
from colo_fsm.testing.lifecycle_machine import KitHandle, RunConfig, lifecycle_machine, recording_fakes

S = State


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _config(**changes: Any) -> RunConfig:
    base: dict[str, Any] = dict(
        num_steps=1,
        start_step=0,
        start_weight_version=0,
        checkpoint_every=None,
        must_save_by_s=None,
        validate_every=1,
        inline_validator=True,
        max_trajectory_age_steps=2,
        num_prompts_per_step=1,
        samples_per_group=1,
        actor_max_concurrency=16,
        control_headroom=0,
    )
    base.update(changes)
    return RunConfig(**base)


class DecodingValidator:
    """A validation that decodes on the engine, as a real one does (its decode step runs in Validating)."""

    def __init__(self, handle: KitHandle) -> None:
        self.handle = handle

    def __call__(self, step: int, weight_version: int) -> dict[str, float]:
        engine = self.handle.extra["engine"]
        engine.submit(1)
        engine.decode_step()
        return {"reward": 1.0}


def _engine_in_extra(handle: KitHandle) -> Any:
    ad = recording_fakes()
    handle.extra["engine"] = ad.engine
    return ad


def test_a_validation_decode_is_not_charged_to_the_state_the_step_ends_in():
    """One kit step runs Validating -> Checkpointing -> Done (NeMo-RL's last step: validate, save, done); the
    validator's decode step ran in Validating, where the engine is awake for it, never in Done."""
    machine_cls = lifecycle_machine(
        _engine_in_extra,
        spec=NEMO_RL,
        validator_factory=DecodingValidator,
        validation_factory=lambda: ValidationDecision(1),
        checkpoint_factory=lambda: LatchedDecision("checkpoint", lambda step: True),
    )
    m = machine_cls()
    try:
        m.setup(_config(), autostart=1, first_fault=None)
        m.whole_step()
        assert m.lc is not None and m.lc.state is S.DONE and m.ad is not None and m.ad.engine.decode_steps == 1
        m.no_decode_while_parked()
    finally:
        m.teardown()
