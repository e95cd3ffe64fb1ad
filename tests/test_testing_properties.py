"""The shipped components satisfy the component properties the mutation proof uses (no false alarms)."""

from __future__ import annotations

from tests.support import properties as p


def test_latch_property_holds():
    p.check_latch_property()


def test_in_flight_cap_property_holds():
    p.check_in_flight_cap_property()


def test_parallelism_property_holds():
    p.check_parallelism_property()


def test_wall_clock_metrics_property_holds():
    p.check_wall_clock_metrics_property()


def test_trainable_property_holds():
    p.check_trainable_property()


def test_replay_buffer_property_holds():
    from tests.support.properties import check_replay_buffer_property

    check_replay_buffer_property()
