"""The tensor-parallel lockstep of the engine loop: two ranks (threads) whose batchers must issue one schedule.

Each rank's :class:`~colo_fsm.adapters.batching.ContinuousBatcher` runs over a recording backend; the same
requests are submitted on both ranks with different delays and the same suspend/resume calls are made, as in
an SPMD program. With a lockstep every backend call sequence (add, step over which rows, abort, suspend,
resume) is identical on both ranks; that is what lets TP peers run one forward together.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from colo_fsm.adapters.batching import ContinuousBatcher, StepOutput
from colo_fsm.adapters.lockstep import StepPlan
from colo_fsm.errors import ConfigError


class ThreadLockstep:
    """:class:`~colo_fsm.adapters.lockstep.Lockstep` for ranks as threads: rank 0's plan, through a barrier."""

    def __init__(self, shared: threading.Barrier, slot: list, rank: int) -> None:
        self.shared, self.slot, self.leader, self.width = shared, slot, rank == 0, 64

    def agree(self, plan: StepPlan) -> StepPlan:
        if self.leader:
            self.slot[0] = StepPlan.from_ints(plan.to_ints(self.width))  # through the wire form
        self.shared.wait(timeout=30)
        got = self.slot[0]
        self.shared.wait(timeout=30)
        return got


class Recording:
    """A backend that ends each request after ``len(prompt)`` tokens and records every call."""

    name = "recording"

    def __init__(self, log: list) -> None:
        self.log, self.rows = log, {}

    def add(self, req):
        self.rows[req.request_id] = len(req.prompt_ids)
        self.log.append(("add", req.request_id))

    def step(self):
        self.log.append(("step", tuple(sorted(self.rows))))
        out = []
        for rid in list(self.rows):
            self.rows[rid] -= 1
            done = self.rows[rid] == 0
            out.append(StepOutput(rid, (5,), (0.0,), "length" if done else None))
            if done:
                del self.rows[rid]
        time.sleep(0.001)
        return out

    def abort(self, rid):
        self.rows.pop(rid, None)
        self.log.append(("abort", rid))

    def suspend(self):
        self.log.append(("suspend",))
        return 0.0

    def resume(self):
        self.log.append(("resume",))
        return 0.0

    def shutdown(self):
        self.log.append(("shutdown",))


def _spmd(lockstep: bool, seed: int) -> tuple[list, list, list]:
    shared, slot = threading.Barrier(2), [None]
    logs: list[list] = [[], []]
    results: list[list] = [[], []]
    go = threading.Barrier(2)

    def rank(r: int) -> None:
        lock = ThreadLockstep(shared, slot, r) if lockstep else None
        kw = {"lockstep": lock} if lock is not None else {}
        b = ContinuousBatcher(lambda: Recording(logs[r]), max_active_requests=3, **kw)
        b.start()
        rng = random.Random(seed * 10 + r)  # each rank submits at its own pace
        handles = []
        for cycle in range(4):
            for i in range(3):
                handles.append(b.submit([1] * (1 + (cycle + i) % 4), max_tokens=8))
                time.sleep(rng.random() * 0.004)
            time.sleep(rng.random() * 0.01)
            go.wait(timeout=30)  # the SPMD program reaches the handoff on both ranks
            b.suspend()
            b.resume()
        handles[1].cancel()  # an SPMD abort (both ranks cancel the same request)
        results[r] = [h.result(timeout=30).finish_reason for h in handles]
        go.wait(timeout=30)
        b.shutdown()

    ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    return logs[0], logs[1], results


@pytest.mark.parametrize("seed", [1, 2])
def test_lockstep_ranks_issue_one_schedule(seed):
    a, b, results = _spmd(lockstep=True, seed=seed)
    assert a == b
    assert sum(1 for c in a if c[0] == "step") > 4 and a.count(("suspend",)) == 4
    assert results[0] == results[1] and len(results[0]) == 12


def test_a_follower_abort_answers_its_caller_and_keeps_the_schedule():
    shared, slot = threading.Barrier(2), [None]
    logs: list[list] = [[], []]
    out: dict = {}
    hold = threading.Event()

    def rank(r):
        b = ContinuousBatcher(lambda: Recording(logs[r]), lockstep=ThreadLockstep(shared, slot, r))
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


def test_step_plan_wire_form_round_trips_and_is_bounded():
    p = StepPlan("step", (3, 4, 9), (1,))
    assert StepPlan.from_ints(p.to_ints(16)) == p
    assert StepPlan.from_ints(StepPlan("suspend", drain=True).to_ints(8)) == StepPlan("suspend", drain=True)
    with pytest.raises(ConfigError, match="lockstep plan"):
        StepPlan("step", tuple(range(20))).to_ints(16)
