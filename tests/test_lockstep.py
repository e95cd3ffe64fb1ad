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
from colo_fsm.adapters.lockstep import FEED_ID_BASE, CarriedRequest, StepPlan
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


def test_leader_only_requests_are_carried_to_the_follower_in_the_plan():
    """What the group's one HTTP server needs: requests submitted on the leader alone (``feed=True``) reach the
    follower through the plan, one of them ended by the leader's own ``on_token`` (a stop string): both
    backends still see one schedule, and the follower never waits for a submission of its own."""
    shared, slot, go = threading.Barrier(2), [None], threading.Barrier(2)
    logs: list[list] = [[], []]
    out: dict = {}

    def stop_after(n):
        seen = []
        return lambda *a: False if seen.append(a) or len(seen) >= n else None

    def rank(r):
        b = ContinuousBatcher(
            lambda: RecordingStepBackend(logs[r]), lockstep=ThreadLockstep(shared, slot, r), lockstep_wait_s=30
        )
        b.start()
        spmd = b.submit([1] * 4, max_tokens=8)
        if r == 0:
            fed = [
                b.submit([2] * 6, max_tokens=8, temperature=0.7, seed=3, stop_token_ids=(9,), feed=True),
                b.submit([3] * 7, max_tokens=8, on_token=stop_after(2), feed=True),
            ]
            out["fed"] = [(len(h.result(timeout=30).token_ids), h.result().finish_reason) for h in fed]
        else:
            with pytest.raises(ConfigError, match="feed=True"):
                b.submit([1], max_tokens=2, feed=True)
        out[r] = spmd.result(timeout=30).finish_reason
        go.wait(timeout=30)
        b.suspend()
        b.resume()
        b.shutdown()

    ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert out["fed"] == [(6, "length"), (2, "stop")] and out[0] == out[1] == "length"
    assert logs[0] == logs[1]
    fed_ids = {rid for c in logs[1] if c[0] == "step" for rid in c[1] if rid >= FEED_ID_BASE}
    assert len(fed_ids) == 2


def test_step_plan_carries_leader_only_requests_on_the_wire():
    c = CarriedRequest(FEED_ID_BASE + 3, (5, 6, 7), 9, 0.7, 0.95, 4, None, 2, (1, 2), 1)
    d = CarriedRequest(FEED_ID_BASE + 4, (8,), 1, 1e-3, 1.0, 0, 12345, 0, (), 0)
    p = StepPlan("step", (2, c.request_id, d.request_id), (1,), carried=(c, d))
    assert StepPlan.from_ints(p.to_ints(16)) == p
    assert len(p.to_ints(16)) == 16 + len(p.payload())


def test_an_idle_follower_serves_what_the_leader_alone_was_given():
    """A follower with no work of its own (no request, no command: a gym-driven run waiting for HTTP answers)
    still takes the leader's plans: a request fed on the leader completes without any call on the follower."""
    import concurrent.futures

    shared, slot = threading.Barrier(2), [None]
    logs: list[list] = [[], []]
    batchers = [
        ContinuousBatcher(lambda r=r: RecordingStepBackend(logs[r]), lockstep=ThreadLockstep(shared, slot, r))
        for r in (0, 1)
    ]
    starts = [threading.Thread(target=b.start) for b in batchers]
    for t in starts:
        t.start()
    for t in starts:
        t.join(timeout=30)
    h = batchers[0].submit([2] * 5, max_tokens=8, feed=True)
    done, _ = concurrent.futures.wait([h.future], timeout=20)
    stops = [threading.Thread(target=b.shutdown) for b in batchers]
    for t in stops:
        t.start()
    for t in stops:
        t.join(timeout=30)
    assert done, "the leader's request waited for the follower to have work of its own"
    assert h.result().finish_reason == "length" and logs[0] == logs[1]


def test_a_fed_request_resubmitted_at_an_abort_mode_suspend_is_carried_once():
    """``inflight="abort"`` with a request the leader alone was given: the suspend ends it on every rank and
    queues it again everywhere, so the plan carries it only at its first admission (the follower re-admits its
    own queued copy, under the new id) and the follower's copy keeps the leader's ``logprobs_mode``. The backend
    ends the resubmitted row itself (3 + 2 prompt tokens, 5 more), so no abort of the leader's cleans up after a
    second copy."""
    shared, slot, go = threading.Barrier(2), [None], threading.Barrier(2)
    logs: list[list] = [[], []]
    modes: list[tuple[int, str]] = []
    held, out = threading.Event(), {}

    class ModeBackend(RecordingStepBackend):
        def add(self, req):
            modes.append((req.request_id, req.logprobs_mode))
            super().add(req)

    def rank(r):
        backend = ModeBackend(logs[r]) if r == 1 else RecordingStepBackend(logs[r])
        b = ContinuousBatcher(
            lambda: backend, lockstep=ThreadLockstep(shared, slot, r), lockstep_wait_s=30, inflight="abort"
        )
        b.start()
        if r == 0:
            seen: list = []

            def hold(*a):  # after its 2nd token the leader's row waits for the suspend: it is in flight there
                seen.append(a)
                if len(seen) == 2:
                    held.set()
                    b.wait_for_control(30)

            h = b.submit([2] * 3, max_tokens=8, on_token=hold, feed=True, logprobs_mode="processed")
        assert held.wait(30)
        b.suspend()
        b.resume()
        if r == 0:
            out["done"] = h.result(timeout=30)
        go.wait(timeout=30)
        with b._cond:  # nothing left queued or running on either rank (a second copy would stay queued)
            out[r] = b._cond.wait_for(lambda: b.counts() == (0, 0, 0), 10)
        go.wait(timeout=30)
        b.shutdown()

    ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    c = out["done"]
    assert (len(c.token_ids), c.finish_reason, c.resubmissions) == (7, "length", 1)  # the backend ended it
    assert out[0] and out[1], "a copy of the fed request stayed behind on a rank"
    assert logs[0] == logs[1]
    assert modes == [(FEED_ID_BASE, "processed"), (FEED_ID_BASE + (1 << 40), "processed")]


def test_a_carried_request_keeps_its_logprobs_mode_on_the_wire():
    c = CarriedRequest(FEED_ID_BASE, (5,), 3, logprobs_mode="processed")
    p = StepPlan("step", (c.request_id,), carried=(c,))
    assert StepPlan.from_ints(p.to_ints(16)).carried[0].logprobs_mode == "processed"


def test_a_follower_that_ended_its_own_row_still_steps_on_the_leaders_plan():
    """A follower's ``on_token`` ends its copy of a row early (a decision of that rank alone): its engine has no
    row of its own left, yet it steps whenever the leader's plan says step, so the group's forwards stay one
    schedule (a rank skipping a step would leave its peers waiting in the model's collectives)."""
    shared, slot, go = threading.Barrier(2), [None], threading.Barrier(2)
    logs: list[list] = [[], []]
    out: dict = {}

    def rank(r):
        b = ContinuousBatcher(lambda: RecordingStepBackend(logs[r]), lockstep=ThreadLockstep(shared, slot, r))
        b.start()
        h = b.submit([1] * 4, max_tokens=4, on_token=(lambda *a: False) if r == 1 else None)
        out[r] = h.result(timeout=30)
        go.wait(timeout=30)
        b.shutdown()

    ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert (len(out[0].token_ids), out[0].finish_reason) == (4, "length")
    assert (len(out[1].token_ids), out[1].finish_reason) == (1, "stop")
    assert logs[0] == logs[1]
    assert sum(1 for c in logs[1] if c[0] == "step") == 4
