"""The replay buffer's batch order: start order waits for the oldest reservations; deadline order takes what
must go now and fills the rest with finished groups, and still never lets an admitted group go stale."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector import ReplayBuffer, TrajectoryGroup
from colo_fsm.collector.batch_order import Place, forced_count, pick
from colo_fsm.errors import ConfigError, WaitTimeout
from tests.support.buffer_steps import generate_then_sample


def _group(ticket, version_now: int) -> TrajectoryGroup:
    """A group whose tokens came from its ticket's version up to ``version_now`` (parked through the steps)."""
    c = Completion("ab", (1, 2), ticket.weight_version, weight_versions=(ticket.weight_version, version_now))
    return TrajectoryGroup(f"g{ticket.seq}", "p", (c,), (1.0,), ticket.weight_version, ticket.target_step)


def test_a_long_rollout_at_the_head_holds_a_start_order_step_but_not_a_deadline_order_one():
    """Two places per step, max_age 2: the first rollout is long; the next two finished. Start order waits for
    the first; deadline order trains on the two finished ones now, and the long one still has two steps."""
    for order, expect in (("start", None), ("deadline", ["g2", "g3"])):
        b = ReplayBuffer(2, 2, order=order)
        tickets = [b.reserve(0) for _ in range(3)]
        for t in tickets[1:]:
            assert b.put(_group(t, 0), ticket=t)
        if expect is None:
            assert b.ready(0) == 0
            with pytest.raises(WaitTimeout):
                b.sample(0, timeout=0)
        else:
            assert b.ready(0) == 2
            assert [g.prompt_id for g in b.sample(0, timeout=0)] == expect
    assert tickets[0].target_step == 2  # deadline order: the ticket names the last step that may train on it


def test_a_rollout_at_its_last_step_is_waited_for():
    """The same long rollout at its deadline (version 2): the step waits for it even with others finished."""
    b = ReplayBuffer(1, 2, order="deadline")
    long = b.reserve(0)
    b.advance(2)
    others = [b.reserve(2) for _ in range(2)]
    for t in others:
        b.put(_group(t, 2), ticket=t)
    assert forced_count([Place(long.seq, 0, False), Place(others[0].seq, 2, True)], 1, 2, 2) == 1
    assert b.ready(2) == 0
    with pytest.raises(WaitTimeout):
        b.sample(2, timeout=0)
    b.put(_group(long, 2), ticket=long)
    assert [g.prompt_id for g in b.sample(2, timeout=0)] == [f"g{long.seq}"]


def test_pick_in_start_order_is_the_head_and_an_unknown_order_is_refused():
    places = [Place(1, 0, True), Place(2, 0, False), Place(3, 0, True)]
    assert pick(places, 1, 0, 2, "start") == [1] and pick(places, 2, 0, 2, "start") is None
    assert pick(places, 2, 0, 2, "deadline") == [1, 3]
    with pytest.raises(ConfigError) as err:
        ReplayBuffer(2, 1, order="completion")
    assert err.value.field == "order" and err.value.value == "completion" and "'deadline'" in err.value.expected


@settings(max_examples=400, deadline=None)
@given(
    order=st.sampled_from(["start", "deadline"]),
    n=st.integers(1, 3),
    max_age=st.integers(0, 3),
    ops=st.lists(st.tuples(st.sampled_from(["start", "finish", "step"]), st.integers(0, 10)), max_size=80),
)
def test_parked_rollouts_never_go_stale_and_steps_never_starve(order: str, n: int, max_age: int, ops: list) -> None:
    """A collector that parks: rollouts start whenever the buffer admits them, finish in any order, and stay in
    flight across steps (tokens from several versions). Each step generates until the buffer can sample, then
    trains. In either order no admitted group is ever evicted, no batch holds a group older than max_age, no
    step deadlocks, and a group is never trained after its ticket's step (start: its step; deadline: its last)."""
    b = ReplayBuffer(n, max_age, order=order)
    version, in_flight = 0, []

    def start() -> bool:
        ticket = b.reserve(version)
        if ticket is None:
            return False
        in_flight.append(ticket)
        return True

    def finish(i: int) -> None:
        ticket = in_flight.pop(i % len(in_flight))
        assert b.put(_group(ticket, version), ticket=ticket)

    for op, i in ops:
        if op == "start":
            start()
        elif op == "finish" and in_flight:
            finish(i)
        elif op == "step":
            generate_then_sample(b, version, start, lambda i=i: finish(i), lambda: bool(in_flight))
            version += 1  # the rollouts in flight stay parked through the training step
            b.advance(version)
        assert b.evicted_stale == 0
