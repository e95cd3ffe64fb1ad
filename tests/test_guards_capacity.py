"""Bounded in-flight work: age bound and actor capacity with control headroom."""

import logging

import pytest

from colo_fsm.errors import ConfigError
from colo_fsm.guards.capacity import InFlightCap


def test_cap_is_min_of_age_bound_and_actor_capacity():
    cap = InFlightCap(
        num_prompts_per_step=64,
        max_trajectory_age_steps=4,
        samples_per_group=16,
        actor_max_concurrency=1000,
        control_headroom=8,
    )
    assert cap.configured == 256
    assert cap.actor_capacity_groups == (1000 - 8) // 16 == 62
    assert cap.value == 62 and cap.lowered


def test_not_lowered_when_actor_has_room():
    cap = InFlightCap(num_prompts_per_step=4, max_trajectory_age_steps=2, samples_per_group=8)
    assert cap.value == 8 and not cap.lowered


def test_lowering_is_reported_with_both_numbers(caplog):
    cap = InFlightCap(num_prompts_per_step=64, max_trajectory_age_steps=4, samples_per_group=16)
    with caplog.at_level(logging.WARNING, logger="colo_fsm.guards"):
        assert cap.report() == 62
    text = caplog.text
    assert "62" in text and "256" in text


def test_quiet_when_not_lowered(caplog):
    cap = InFlightCap(num_prompts_per_step=1, max_trajectory_age_steps=1, samples_per_group=1)
    with caplog.at_level(logging.WARNING, logger="colo_fsm.guards"):
        cap.report()
    assert caplog.text == ""


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_prompts_per_step": 0}, "num_prompts_per_step"),
        ({"max_trajectory_age_steps": -1}, "max_trajectory_age_steps"),
        ({"samples_per_group": 0}, "samples_per_group"),
        ({"control_headroom": 1000}, "control_headroom"),
        ({"control_headroom": -1}, "control_headroom"),
        ({"samples_per_group": 993}, "samples_per_group"),
        ({"actor_max_concurrency": 2.5}, "actor_max_concurrency"),
    ],
)
def test_nonsense_is_rejected(kwargs, field):
    base = {"num_prompts_per_step": 4, "max_trajectory_age_steps": 2, "samples_per_group": 8}
    base.update(kwargs)
    with pytest.raises(ConfigError, match=field):
        InFlightCap(**base)


def test_ignoring_actor_capacity_would_overrun_the_actor():
    """The bug: capping by the age bound alone puts more calls on the actor than it runs at once."""
    cap = InFlightCap(num_prompts_per_step=64, max_trajectory_age_steps=4, samples_per_group=16)
    assert cap.configured * cap.samples_per_group > cap.actor_max_concurrency
    assert cap.value * cap.samples_per_group + cap.control_headroom <= cap.actor_max_concurrency
