"""Decide once: latched checkpoint/validation decisions and the one-shot time rule."""

import pytest

from colo_fsm.errors import ConfigError
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, MustSaveBy, ValidationDecision


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_rule_fires_once_then_stays_quiet():
    clock = FakeClock()
    rule = MustSaveBy(10, clock=clock)
    assert rule() is False
    clock.now = 10
    assert rule() is True
    assert rule() is False  # the latch hazard: a second query reports no save


def test_second_query_in_the_same_step_cannot_lose_the_save():
    clock = FakeClock()
    d = CheckpointDecision(must_save_by_s=5, clock=clock)
    assert d.decide(0) is False
    clock.now = 6
    assert d.decide(1) is True
    assert d.decide(1) is True  # same step, same answer: the save is not lost at the second site
    assert d.evaluations == 2
    assert d.stops_run(1) is True
    assert d.decide(2) is False


def test_unlatched_double_query_loses_the_save():
    """What the latch prevents: asking the raw time rule at two sites skips the save at the second."""
    clock = FakeClock()
    rule = MustSaveBy(0, clock=clock)
    first_site, second_site = rule(), rule()
    assert first_site != second_site


def test_periodic_rules():
    d = CheckpointDecision(every_steps=3)
    assert [d.decide(s) for s in range(7)] == [False, False, True, False, False, True, False]
    v = ValidationDecision(every_steps=2)
    assert [v.decide(s) for s in range(4)] == [False, True, False, True]
    assert ValidationDecision().decide(0) is False


def test_agree_makes_every_rank_adopt_one_answer():
    calls = []

    def agree(x: bool) -> bool:
        calls.append(x)
        return True

    d = LatchedDecision("x", lambda step: False, agree=agree)
    assert d.decide(0) is True
    assert d.decide(0) is True
    assert calls == [False]


def test_peek_never_evaluates():
    d = LatchedDecision("x", lambda step: True)
    assert d.peek(0) is None
    d.decide(0)
    assert d.peek(0) is True
    assert d.evaluations == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
def test_bad_periods(bad):
    with pytest.raises(ConfigError, match="every_steps"):
        CheckpointDecision(every_steps=bad)


def test_steps_are_latched_in_order():
    d = CheckpointDecision(every_steps=2)
    d.decide(3)
    with pytest.raises(ConfigError, match="step"):
        d.decide(2)
    with pytest.raises(ConfigError, match="step"):
        d.decide(-1)


def test_bad_deadline():
    with pytest.raises(ConfigError, match="must_save_by_s"):
        MustSaveBy(-1)


def test_deadline_stop_is_agreed_across_ranks_whose_clocks_differ():
    """Rank 0's deadline passed, rank 1's clock is behind: both must save AND stop at the same step."""
    c0, c1 = FakeClock(), FakeClock()
    broadcast: list[bool] = []  # what rank 0 sends, in call order (a stand-in for a torch broadcast)

    def rank0_agree(x: bool) -> bool:
        broadcast.append(x)
        return x

    def rank1_agree(_x: bool) -> bool:
        rank1_calls.append(_x)
        return broadcast[len(rank1_calls) - 1]

    rank1_calls: list[bool] = []
    d0 = CheckpointDecision(must_save_by_s=10, clock=c0, agree=rank0_agree)
    d1 = CheckpointDecision(must_save_by_s=12, clock=c1, agree=rank1_agree)
    for step, now in enumerate([5.0, 11.0, 13.0]):
        c0.now = c1.now = now
        s0, s1 = d0.decide(step), d1.decide(step)
        assert s0 == s1, step
        assert d0.stops_run(step) == d1.stops_run(step), step
    assert d0.deadline_step == d1.deadline_step == 1
    assert rank1_calls[2] is False  # rank 1's own clock said "not yet" at step 1; the world said stop


def test_bad_deadline_stop():
    with pytest.raises(ConfigError, match="deadline_stop"):
        CheckpointDecision(must_save_by_s=1, deadline_stop="x")
