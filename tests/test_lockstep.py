"""The tensor-parallel lockstep of the engine loop: two ranks (threads) whose batchers must issue one schedule.

Each rank's :class:`~colo_fsm.adapters.batching.ContinuousBatcher` runs over a recording backend; the same
requests are submitted on both ranks at different paces and the same suspend/resume calls are made, as in an
SPMD program. With a lockstep every backend call sequence (add, step over which rows, abort, suspend, resume) is
identical on both ranks: what lets TP peers run one forward together. The mutant without it
(``tp-ranks-step-independently``) is killed by the same property (tests/test_mutants.py).
"""

from __future__ import annotations

import threading

import pytest

from colo_fsm.adapters.batching import ContinuousBatcher
from colo_fsm.adapters.lockstep import StepPlan
from colo_fsm.errors import ConfigError
from tests.support.properties import RecordingStepBackend, ThreadLockstep, check_tp_lockstep_property, tp_schedules


def test_lockstep_ranks_issue_one_schedule():
    check_tp_lockstep_property()
    a, _ = tp_schedules(None, seed=3)
    assert sum(1 for c in a if c[0] == "step") > 4 and a.count(("suspend",)) == 4


def test_without_the_lockstep_the_schedules_differ():
    """The property can fail: the same program with no lockstep gives the two ranks different schedules."""
    assert any(len(set(map(tuple, tp_schedules(None, seed=s, lockstep=False)))) == 2 for s in (1, 2, 3))


def test_a_follower_abort_answers_its_caller_and_keeps_the_schedule():
    shared, slot = threading.Barrier(2), [None]
    logs: list[list] = [[], []]
    out: dict = {}
    hold = threading.Event()

    def rank(r):
        b = ContinuousBatcher(lambda: RecordingStepBackend(logs[r]), lockstep=ThreadLockstep(shared, slot, r))
        b.start()
        h = b.submit([1] * 6, max_tokens=8)
        h2 = b.submit([1] * 2, max_tokens=8)
        if r == 1:
            h.cancel()  # only the follower's caller gives up
            out["follower"] = h.result(timeout=30).finish_reason
        out[r] = (h.result(timeout=30).finish_reason, h2.result(timeout=30).finish_reason)
        hold.wait(timeout=30) if r == 0 else hold.set()
        b.shutdown()

    ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert out["follower"] == "abort" and out[0] == ("length", "length")
    assert logs[0] == logs[1]  # the row ran on in step with the leader
    assert ("abort", 0) not in logs[1]


def test_step_plan_wire_form_round_trips_and_is_bounded():
    p = StepPlan("step", (3, 4, 9), (1,))
    assert StepPlan.from_ints(p.to_ints(16)) == p
    assert StepPlan.from_ints(StepPlan("suspend", drain=True).to_ints(8)) == StepPlan("suspend", drain=True)
    with pytest.raises(ConfigError, match="lockstep plan"):
        StepPlan("step", tuple(range(20))).to_ints(16)
