"""Three real gloo ranks: the guards whose bugs two ranks cannot show (one spawn for every case; see
tests/support/three_ranks.py). Each test is killed by an assertion when its component is swapped for its mutant
(tests/test_mutants.py::test_suite_mutant_is_killed)."""

from __future__ import annotations

import pytest

from tests.support.three_ranks import judge_barrier_deadline, judge_lockstep, judge_stop_agreement, run_three_ranks


@pytest.fixture(scope="module")
def three_ranks() -> dict[str, dict[int, object]]:
    return run_three_ranks()


def test_lockstep_followers_take_the_leaders_plan(three_ranks):
    """TorchLockstep over three ranks: each follower planned a step of its own, and runs the leader's."""
    problems = judge_lockstep(three_ranks["lockstep"])
    assert not problems, "\n".join(problems)


def test_a_sigterm_to_one_rank_is_agreed_by_every_rank(three_ranks):
    """The demo's StopAgreement and the checkpoint decision it feeds: a real SIGTERM to rank 2 alone makes every
    rank save and end the run after the same step."""
    problems = judge_stop_agreement(three_ranks["stop-agreement"])
    assert not problems, "\n".join(problems)


def test_a_fingerprint_barrier_gives_up_at_its_own_deadline_with_three_ranks(three_ranks):
    """Rank 0 arrives first, rank 1 halfway through rank 0's deadline, rank 2 after it: rank 0 raises
    BarrierTimeout at its deadline (counted from its own arrival), not when rank 2's row finally comes."""
    problems = judge_barrier_deadline(three_ranks["barrier-deadline"])
    assert not problems, "\n".join(problems)
