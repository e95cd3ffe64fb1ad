"""The server's share of the engine: a flood of HTTP (Priority.SERVER) requests never takes the trainer's slots.

Forced with a gated backend: the engine is full of server work and more is queued when the training requests
arrive; at the next step boundary they are admitted into the slots the server may never hold.
"""

from __future__ import annotations

import pytest

from colo_fsm.adapters.batching import ContinuousBatcher, Priority
from colo_fsm.adapters.megatron.engine import GenerationConfig
from colo_fsm.errors import ConfigError
from tests.support.gated import WAIT, GatedBackend


def _server_rows(backend: GatedBackend, server_ids: set[int]) -> list[int]:
    return [len(set(rows) & server_ids) for e in backend.log if e[0] == "step" for rows in [e[1]]]


def test_a_server_flood_leaves_the_training_requests_their_slots():
    backend = GatedBackend()
    b = ContinuousBatcher(lambda: backend, max_active_requests=8, server_share=0.25)
    b.start()
    assert b.server_slots == 2
    b.suspend()  # the flood waits in the queue: the resume admits what the server may hold, in one step
    flood = [b.submit([i], max_tokens=30, priority=Priority.SERVER) for i in range(40)]
    b.resume()
    backend.grant(1)
    backend.wait_steps(1)  # the engine took what the server may hold; the rest of the flood waits
    backend.wait_blocked()  # the engine thread has taken in that step and waits at the next one
    assert b.counts(Priority.SERVER) == (38, 2, 0)
    training = [b.submit([40 + i], max_tokens=3) for i in range(6)]
    backend.grant(2)
    backend.wait_steps(3)  # the iteration after the submission admitted them (step 3 at the latest)
    assert b.counts(Priority.TRAINING) == (0, 6, 0)  # admitted at the next boundary: 6 of the 6 free slots
    assert b.counts() == (38, 8, 0)
    backend.run_free()
    for h in training:
        assert h.result(timeout=WAIT).finish_reason == "length"
    for h in flood:
        assert h.result(timeout=WAIT).finish_reason == "length"  # nothing dropped: server work waited its turn
    ids = {h.request_id for h in flood}
    assert max(_server_rows(backend, ids)) == 2  # never more than the server's share in one step
    assert backend.log.index(("add", training[0].request_id)) < backend.log.index(("add", flood[2].request_id))
    b.shutdown()


def test_without_training_work_the_server_still_holds_only_its_share_and_share_one_lifts_the_cap():
    for share, most in ((0.5, 2), (1.0, 4)):
        backend = GatedBackend(free=True)
        b = ContinuousBatcher(lambda backend=backend: backend, max_active_requests=4, server_share=share)
        hs = [b.submit([i], max_tokens=4, priority=Priority.SERVER) for i in range(8)]
        b.start()  # after the submits: the first step sees all eight, whatever the load
        for h in hs:
            h.result(timeout=WAIT)
        assert max(_server_rows(backend, {h.request_id for h in hs})) == most
        b.shutdown()


@pytest.mark.parametrize("value", [0, -0.1, 1.5, "half", True, None])
def test_server_share_is_validated_with_a_typed_error(value):
    with pytest.raises(ConfigError) as exc:
        ContinuousBatcher(lambda: GatedBackend(), server_share=value)
    assert exc.value.field == "server_share"
    with pytest.raises(ConfigError) as exc:
        GenerationConfig(server_share=value)
    assert exc.value.field == "server_share" and "(0, 1]" in str(exc.value)


def test_within_the_share_a_small_request_is_not_queued_behind_a_large_ones_choices():
    """The HTTP server numbers a request's choices (``turn``): a 1-choice request submitted after a 12-choice one
    waits behind its first choice only, not behind all twelve; lone requests keep their arrival order."""
    backend = GatedBackend()
    b = ContinuousBatcher(lambda: backend, max_active_requests=8, server_share=0.25)
    # every request queued before the loop starts: a loop already running could admit hog's turn 1 before small
    # is submitted (it did once on a loaded machine), which is arrival order, not the rule under test
    hog = [b.submit([1], max_tokens=3, priority=Priority.SERVER, turn=t) for t in range(12)]
    small = b.submit([2], max_tokens=1, priority=Priority.SERVER)  # turn 0
    late = b.submit([3], max_tokens=1, priority=Priority.SERVER)  # turn 0, after small
    b.start()
    backend.run_free()
    for h in (*hog, small, late):
        h.result(timeout=WAIT)
    added = [e[1] for e in backend.log if e[0] == "add"]
    assert added.index(small.request_id) < added.index(hog[1].request_id)  # only hog's turn 0 before it
    assert added.index(late.request_id) < added.index(hog[1].request_id)
    assert added.index(small.request_id) < added.index(late.request_id)  # the same turn: arrival order
    assert [added.index(h.request_id) for h in hog] == sorted(added.index(h.request_id) for h in hog)
    b.shutdown()


@pytest.mark.parametrize("value", [-1, 1.5, "0", True])
def test_turn_is_validated_with_a_typed_error(value):
    b = ContinuousBatcher(lambda: GatedBackend(free=True))
    b.start()
    with pytest.raises(ConfigError) as exc:
        b.submit([1], max_tokens=1, turn=value)
    assert exc.value.field == "turn"
    b.shutdown()
