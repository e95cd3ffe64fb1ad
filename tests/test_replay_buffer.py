"""Replay buffer: age bound, eviction counts, exact batches, blocking sample, checkpoint/restore."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector import ReplayBuffer, TrajectoryGroup
from colo_fsm.errors import ConfigError, RolloutFailed, WaitTimeout
from tests.support.buffer_steps import generate_then_sample


def group(pid: str, version: int, target: int | None = None, n: int = 2) -> TrajectoryGroup:
    samples = tuple(Completion(f"{pid}-{i}", (i, i + 1), version) for i in range(n))
    return TrajectoryGroup(pid, f"prompt {pid}", samples, tuple(float(i) for i in range(n)), version, target)


# ---------------------------------------------------------------- TrajectoryGroup validation
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt_id": ""}, "prompt_id"),
        ({"samples": ()}, "samples"),
        ({"samples": (1,), "rewards": (1.0,)}, "samples[0]"),
        ({"rewards": (1.0,)}, "rewards"),
        ({"rewards": (1.0, float("nan"))}, "rewards[1]"),
        ({"rewards": (1.0, True)}, "rewards[1]"),
        ({"weight_version": -1}, "weight_version"),
        ({"weight_version": 1.5}, "weight_version"),
        ({"target_step": -2}, "target_step"),
    ],
)
def test_group_validation_names_the_field(kwargs: dict, field: str) -> None:
    base = {"prompt_id": "a", "prompt": "p", "samples": ("x", "y"), "rewards": (0.0, 1.0), "weight_version": 0}
    base.update(kwargs)
    with pytest.raises(ConfigError) as info:
        TrajectoryGroup(**base)
    assert info.value.field == field


def test_group_accepts_strings_and_round_trips() -> None:
    g = TrajectoryGroup("a", "p", ("x", "y"), (0, 1), 3, 4, {"answer": "42"})
    assert g.samples[0] == Completion("x", (), 3)
    assert g.rewards == (0.0, 1.0)
    assert TrajectoryGroup.from_dict(json.loads(json.dumps(g.to_dict()))) == g


def test_buffer_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="num_prompts_per_step"):
        ReplayBuffer(0, 1)
    with pytest.raises(ConfigError, match="max_trajectory_age_steps"):
        ReplayBuffer(2, -1)
    b = ReplayBuffer(2, 1)
    with pytest.raises(ConfigError, match="timeout"):
        b.sample(0, timeout=-1)
    with pytest.raises(ConfigError, match="group"):
        b.put("not a group")  # type: ignore[arg-type]


# ---------------------------------------------------------------- age bound and eviction
def test_age_bound_evicts_and_counts() -> None:
    evicted: list[tuple[str, int]] = []
    b = ReplayBuffer(2, 1, on_evict=lambda g, age: evicted.append((g.prompt_id, age)))
    for pid, v in (("v0a", 0), ("v0b", 0), ("v1a", 1), ("v2a", 2), ("v2b", 2)):
        b.put(group(pid, v))
    assert len(b) == 5
    batch = b.sample(2, timeout=1)  # at version 2 with max age 1, the v0 groups are too old
    assert sorted(evicted) == [("v0a", 2), ("v0b", 2)]
    assert b.evicted_stale == 2
    assert [g.age(2) for g in batch] == [1, 0]  # the older fresh group first
    assert {g.prompt_id for g in batch} == {"v1a", "v2a"}
    st_ = b.stats()
    assert (st_.size, st_.evicted_stale, st_.weight_version, st_.average_age) == (1, 2, 2, 0.0)


def test_put_of_a_group_already_too_old_is_counted_not_kept() -> None:
    b = ReplayBuffer(1, 0)
    b.advance(5)
    assert b.put(group("old", 4)) is False
    assert b.evicted_stale == 1 and len(b) == 0
    assert b.put(group("new", 5)) is True


def test_max_age_zero_trains_only_on_current_weights() -> None:
    b = ReplayBuffer(1, 0)
    b.put(group("a", 0))
    b.put(group("b", 1))
    assert [g.prompt_id for g in b.sample(1, timeout=0)] == ["b"]
    assert b.evicted_stale == 1


# ---------------------------------------------------------------- exact batches and blocking
def test_sample_returns_exactly_num_prompts_per_step() -> None:
    b = ReplayBuffer(4, 2)
    for i in range(10):
        b.put(group(f"g{i}", 0))
    batch = b.sample(0, timeout=0)
    assert len(batch) == 4 and len({g.prompt_id for g in batch}) == 4
    assert len(b) == 6
    assert len(b.sample(0, timeout=0)) == 4
    with pytest.raises(WaitTimeout, match="4 fresh trajectory groups"):
        b.sample(0, timeout=0.05)
    assert len(b) == 2  # a timed-out sample takes nothing


def test_sample_blocks_until_enough_fresh_groups() -> None:
    b = ReplayBuffer(3, 1)
    b.put(group("a", 0))

    def producer() -> None:
        for i in range(2):
            time.sleep(0.05)
            b.put(group(f"late{i}", 0))

    t = threading.Thread(target=producer)
    t0 = time.monotonic()
    t.start()
    batch = b.sample(0, timeout=5)
    t.join()
    assert len(batch) == 3 and time.monotonic() - t0 >= 0.09


def test_stale_groups_do_not_count_towards_a_batch() -> None:
    b = ReplayBuffer(2, 0)
    b.put(group("a", 0))
    b.put(group("b", 0))
    with pytest.raises(WaitTimeout):
        b.sample(1, timeout=0.02)  # both became stale at version 1
    assert b.evicted_stale == 2


def test_producer_failure_wakes_sample() -> None:
    b = ReplayBuffer(2, 1)
    threading.Timer(0.05, lambda: b.fail(RuntimeError("boom"))).start()
    with pytest.raises(RolloutFailed, match="boom"):
        b.sample(0, timeout=5)


def test_fifo_in_start_order_waits_for_the_head() -> None:
    b = ReplayBuffer(2, 1)
    t1, t2, t3 = b.reserve(0), b.reserve(0), b.reserve(0)
    assert t1 and t2 and t3 and [t.target_step for t in (t1, t2, t3)] == [0, 0, 1]
    b.put(group("third", 0), ticket=t3)
    b.put(group("second", 0), ticket=t2)
    assert b.ready(0) == 0  # the head (first) is still being generated
    with pytest.raises(WaitTimeout, match="1 still being generated"):
        b.sample(0, timeout=0.02)
    threading.Timer(0.05, lambda: b.put(group("first", 0), ticket=t1)).start()
    assert [g.prompt_id for g in b.sample(0, timeout=5)] == ["first", "second"]
    assert b.stats().size == 1 and b.stats().pending == 0


def test_released_ticket_leaves_the_queue() -> None:
    b = ReplayBuffer(1, 0)
    t1, t2 = b.reserve(0), b.reserve(0)
    assert t1 is not None and t2 is None  # max age 0: one group for step 0, nothing ahead of time
    b.release(t1)
    t3 = b.reserve(0)
    assert t3 is not None
    b.put(group("x", 0), ticket=t3)
    assert b.sample(0, timeout=0)[0].prompt_id == "x"
    assert b.reserve(0) is None  # step 0 consumed; step 1 is not there yet
    assert b.reserve(1) is not None


# ---------------------------------------------------------------- admission (reservations)
def test_reserve_admits_at_most_the_age_window() -> None:
    b = ReplayBuffer(2, 1)
    tickets = [b.reserve(0) for _ in range(5)]
    assert [t.target_step if t else None for t in tickets] == [0, 0, 1, 1, None]
    for i, t in enumerate(tickets[:4]):
        assert t is not None
        b.put(group(f"g{i}", 0), ticket=t)
    assert [g.prompt_id for g in b.sample(0, timeout=0)] == ["g0", "g1"]
    assert b.reserve(0) is None  # step 0 has sampled: only step 1 remains for version-0 groups, and it is full
    assert b.reserve(1) is not None  # at version 1, steps 1 and 2 are open


def test_unreserved_puts_take_places() -> None:
    b = ReplayBuffer(2, 0)
    b.put(group("direct", 0))
    assert b.reserve(0) is not None and b.reserve(0) is None


def test_put_with_a_stale_ticket_evicts_and_frees_the_place() -> None:
    b = ReplayBuffer(1, 0)
    t = b.reserve(0)
    assert t is not None
    b.advance(1)  # the pending place is not evicted while its rollout runs...
    assert b.pending() == 1
    assert b.put(group("late", 0), ticket=t) is False  # ...but the group is, on arrival, and counted
    assert b.pending() == 0 and b.evicted_stale == 1


# ---------------------------------------------------------------- checkpoint / restore
def test_state_dict_round_trips_through_json() -> None:
    b = ReplayBuffer(2, 1)
    for pid, v in (("a", 0), ("b", 1), ("c", 1)):
        b.put(group(pid, v, v))
    b.sample(1, timeout=0)
    b.advance(2)  # evicts "a" if still there
    state = json.loads(json.dumps(b.state_dict()))
    r = ReplayBuffer(2, 1)
    r.load_state_dict(state)
    assert r.stats() == b.stats()
    assert r.state_dict() == b.state_dict()
    assert r.evicted_stale == b.evicted_stale and r.weight_version == 2
    assert len(r) == 1 and r.stats().consumed_groups == 2
    # the restored group keeps its place at the head: at version 2 three more fit (window 4)
    assert [r.reserve(2) is not None for _ in range(4)] == [True, True, True, False]


def test_load_state_dict_refuses_other_settings_and_garbage() -> None:
    state = ReplayBuffer(2, 1).state_dict()
    with pytest.raises(ConfigError, match="num_prompts_per_step"):
        ReplayBuffer(3, 1).load_state_dict(state)
    with pytest.raises(ConfigError, match="format"):
        ReplayBuffer(2, 1).load_state_dict({**state, "format": 1})
    with pytest.raises(ConfigError, match=r"group\.rewards"):
        ReplayBuffer(2, 1).load_state_dict({**state, "groups": [{"prompt_id": "a", "prompt": "", "samples": []}]})


# ---------------------------------------------------------------- property: nothing is silently lost
@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 3),
    max_age=st.integers(0, 2),
    ops=st.lists(
        st.one_of(st.tuples(st.just("put"), st.integers(0, 3)), st.tuples(st.just("step"), st.just(0))), max_size=40
    ),
)
def test_every_group_is_trained_evicted_or_still_buffered(n: int, max_age: int, ops: list) -> None:
    b = ReplayBuffer(n, max_age)
    version, puts, trained = 0, 0, 0
    for i, (op, lag) in enumerate(ops):
        if op == "put":
            b.put(group(f"g{i}", max(0, version - lag)))
            puts += 1
        else:
            if b.ready(version) >= n:
                batch = b.sample(version, timeout=0)
                assert len(batch) == n
                assert all(0 <= g.age(version) <= max_age for g in batch)
                trained += n
            version += 1
            b.advance(version)
    assert puts == trained + b.evicted_stale + len(b)
    assert b.stats().max_age <= max_age


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 3),
    max_age=st.integers(0, 2),
    ops=st.lists(st.tuples(st.sampled_from(["start", "finish", "fail", "step"]), st.integers(0, 10)), max_size=60),
)
def test_collector_protocol_never_evicts_and_never_starves(n: int, max_age: int, ops: list) -> None:
    """Reserve -> put(ticket) -> sample, rollouts finishing out of order, new rollouts started between the
    sample and the pause (as a collector does until the handoff pauses it): nothing goes stale, no deadlock."""
    b = ReplayBuffer(n, max_age)
    version, in_flight, made = 0, [], 0

    def start() -> bool:
        nonlocal made
        ticket = b.reserve(version)
        if ticket is None:
            return False
        assert version <= ticket.target_step <= version + max_age
        in_flight.append(ticket)
        made += 1
        return True

    def finish(i: int, ok: bool = True) -> None:
        ticket = in_flight.pop(i % len(in_flight))
        if ok:
            assert b.put(group(f"g{ticket.seq}", ticket.weight_version, ticket.target_step), ticket=ticket)
        else:
            b.release(ticket)

    for op, i in ops:
        if op == "start":
            start()
        elif op in ("finish", "fail") and in_flight:
            finish(i, ok=op == "finish")
        elif op == "step":
            generate_then_sample(b, version, start, lambda i=i: finish(i), lambda: bool(in_flight))
            for _ in range(i % 4):  # the collector keeps going until the handoff pauses it
                start()
            while in_flight:  # pause: every rollout in flight finishes
                finish(i)
            version += 1
            b.advance(version)
        assert b.evicted_stale == 0


def _spanning(pid: str, oldest: int, newest: int) -> TrajectoryGroup:
    """A group whose tokens came from weight versions ``oldest..newest`` (a rollout parked through steps)."""
    c = Completion("ab", (1, 2), oldest, weight_versions=(oldest, newest), logprobs=(-0.3, -0.4))
    return TrajectoryGroup(pid, "p", (c,), (1.0,), weight_version=oldest)


def test_group_carries_oldest_and_newest_version_from_its_samples() -> None:
    g = _spanning("a", 1, 3)
    assert (g.weight_version, g.newest_version, g.version_span) == (1, 3, 2)
    back = TrajectoryGroup.from_dict(json.loads(json.dumps(g.to_dict())))
    assert back == g and back.samples[0].weight_versions == (1, 3) and back.samples[0].logprobs == (-0.3, -0.4)
    assert g.with_version(0, 2).newest_version == 3 and g.with_version(4, 4).newest_version == 4
    with pytest.raises(ConfigError, match="newest_weight_version"):
        TrajectoryGroup("a", "p", ("x",), (1.0,), weight_version=2, newest_weight_version=1)


def test_age_of_a_group_spanning_versions_counts_from_the_oldest() -> None:
    buf = ReplayBuffer(1, 1, weight_version=2)
    assert buf.put(_spanning("fresh-tail-old-head", 0, 2)) is False  # age 2 from its oldest, though its last is 2
    assert buf.put(_spanning("ok", 1, 2)) is True
    assert buf.evicted_stale == 1 and buf.stats().max_age == 1
    buf.advance(3)  # now "ok" is 2 old from its oldest (1 from its newest): evicted
    assert buf.evicted_stale == 2 and len(buf) == 0


def test_parked_rollouts_that_outlive_the_age_bound_are_evicted_and_counted() -> None:
    """Rollouts in flight while the version moves on twice: their groups arrive spanning 0..2 and are stale."""
    from colo_fsm.collector import AsyncCollector

    version = [0]
    awake = threading.Event()
    entered: list[str] = []

    def rollout(prompt):  # type: ignore[no-untyped-def]
        first = version[0]
        entered.append(prompt.prompt_id)
        awake.wait(10)  # parked in the engine while it is suspended
        return _spanning(prompt.prompt_id, first, version[0])

    buf = ReplayBuffer(2, 1)
    collector = AsyncCollector(rollout, (f"q{i}" for i in range(100)), buf, lambda: version[0], cap=2)
    try:
        collector.resume()
        deadline = time.monotonic() + 10
        while len(entered) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        collector.pause()
        version[0] = 2
        buf.advance(2)  # two steps trained on other data while these rollouts were parked
        awake.set()
        while collector.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        s = collector.stats()
        assert s.completed == 2 and s.spanning == 2 and s.in_flight == 0
        assert buf.evicted_stale == 2 and len(buf) == 0  # counted from the oldest version (0), not the newest (2)
    finally:
        awake.set()
        collector.close()
