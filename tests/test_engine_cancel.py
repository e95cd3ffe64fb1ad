"""Cancellation is safe in every state of the engine loop, each interleaving forced with a gated backend.

A cancel (a client disconnect, a timeout, ``handle.cancel()``) lands while the request runs, while it is queued,
while it is parked in a suspended engine, during the suspend call itself, during the resume, and racing shutdown.
After each: the request resolved "abort" exactly once, the backend never saw a decode step (or an abort) while
suspended, the slot is free (counts and the backend's rows back to baseline) and the engine still steps.
"""

from __future__ import annotations

import threading

from colo_fsm.adapters.batching import ContinuousBatcher, RequestHandle
from tests.support.gated import WAIT, GatedBackend, run_calls


def _batcher(backend: GatedBackend, **kw) -> ContinuousBatcher:
    b = ContinuousBatcher(lambda: backend, **kw)
    b.start()
    return b


def _quiet(b: ContinuousBatcher) -> int:
    """Wait until the engine thread sleeps with nothing to do (or the loop died); its idle count then."""
    with b._cond:
        assert b._cond.wait_for(lambda: b.idle or b._stopped, WAIT), "the engine loop never went idle"
        return b.idle_waits


def _after(b: ContinuousBatcher, idle: int) -> None:
    """Wait until the engine thread went idle again after ``idle`` (it has seen what happened since), or died."""
    with b._cond:
        assert b._cond.wait_for(lambda: b.idle_waits > idle or b._stopped, WAIT), "the engine loop never settled"


def _suspend_parked(b: ContinuousBatcher, backend: GatedBackend) -> None:
    """Suspend right after the decode step in flight: the running requests are parked."""
    run_calls([b.suspend], [backend], step_in_flight=True)


def _resolutions(h: RequestHandle) -> list[str]:
    """A list that gets one entry each time ``h``'s future resolves (must end with exactly one)."""
    seen: list[str] = []
    h.future.add_done_callback(lambda f: seen.append("cancelled" if f.cancelled() else f.result().finish_reason))
    return seen


def _still_steps(b: ContinuousBatcher, backend: GatedBackend) -> None:
    """The engine admits and decodes a fresh request to its end; nothing is left anywhere afterwards."""
    backend.run_free()
    c = b.submit([7], max_tokens=3).result(timeout=WAIT)
    assert c.finish_reason == "length" and c.token_ids == (7, 8, 9)
    _quiet(b)
    assert b.counts() == (0, 0, 0)
    assert backend.active_ids() == []
    assert b.aborts_pending == 0


def _healthy(b: ContinuousBatcher, backend: GatedBackend) -> None:
    assert not b.stopped, "the engine loop died"
    assert b.steps_while_suspended == 0
    assert backend.violations == []


def test_cancel_while_running_is_applied_at_the_next_step_boundary():
    backend = GatedBackend()
    b = _batcher(backend)
    a, other = b.submit([1], max_tokens=50), b.submit([20], max_tokens=4)
    seen = _resolutions(a)
    backend.grant(2)
    backend.wait_steps(2)
    backend.wait_blocked()  # the third step is now waiting for its grant: a decode step in flight
    assert a.cancel() is True
    assert a.result(timeout=0).finish_reason == "abort" and a.result().token_ids == (1, 2)
    assert b.counts() == (0, 1, 0)  # the slot is free at once for admission
    backend.grant(1)  # the step in flight ends; its token for `a` is dropped, then the abort reaches the backend
    backend.run_free()
    assert other.result(timeout=WAIT).token_ids == (20, 21, 22, 23)
    assert a.result().token_ids == (1, 2)  # nothing appended after the cancel
    assert ("abort", a.request_id) in backend.log
    assert all(a.request_id not in rows for rows in backend.steps_after("abort"))
    _healthy(b, backend)
    _still_steps(b, backend)
    assert seen == ["abort"] and b.completed == 3
    b.shutdown()


def test_cancel_while_queued_never_reaches_the_backend():
    backend = GatedBackend()
    b = _batcher(backend, max_active_requests=1)
    running, queued = b.submit([1], max_tokens=3), b.submit([5], max_tokens=3)
    backend.grant(1)
    backend.wait_steps(1)
    assert b.counts() == (1, 1, 0)
    assert queued.cancel() is True
    assert queued.result(timeout=0).finish_reason == "abort" and queued.result().token_ids == ()
    assert b.counts() == (0, 1, 0)
    backend.run_free()
    assert running.result(timeout=WAIT).finish_reason == "length"
    assert ("add", queued.request_id) not in backend.log
    _healthy(b, backend)
    _still_steps(b, backend)
    b.shutdown()


def test_cancel_while_parked_is_recorded_and_applied_after_the_resume_before_the_first_step():
    """The gym's disconnect during a handoff: it once made the loop decode on the suspended engine and die."""
    backend = GatedBackend()
    b = _batcher(backend)
    a, other = b.submit([1], max_tokens=50), b.submit([20], max_tokens=6)
    seen = _resolutions(a)
    backend.grant(2)
    backend.wait_steps(2)
    _suspend_parked(b, backend)
    assert b.counts() == (0, 0, 2)
    idle = _quiet(b)
    assert a.cancel() is True
    _after(b, idle)  # the engine thread saw the cancel while suspended
    _healthy(b, backend)
    assert a.result(timeout=0).finish_reason == "abort" and a.result().token_ids == (1, 2, 3)
    assert b.counts() == (0, 0, 1) and b.aborts_pending == 1  # recorded, not yet applied
    assert a.request_id in backend.active_ids()  # the suspended engine was not touched
    b.resume()
    backend.run_free()
    assert other.result(timeout=WAIT).token_ids == (20, 21, 22, 23, 24, 25)
    first = backend.steps_after("resume")[0]
    assert a.request_id not in first and other.request_id in first  # applied before the first decode step
    _healthy(b, backend)
    _still_steps(b, backend)
    assert seen == ["abort"]
    b.shutdown()


def test_a_whole_n_request_cancelled_while_parked_frees_every_slot():
    backend = GatedBackend()
    b = _batcher(backend, max_active_requests=4)
    b.suspend()  # the five wait in the queue, so the four are admitted together at the resume, whatever the load
    group = [b.submit([i], max_tokens=40) for i in range(4)]  # one n=4 request: four engine requests
    queued = b.submit([30], max_tokens=2)  # waits for a slot
    b.resume()
    backend.grant(1)
    backend.wait_steps(1)
    _suspend_parked(b, backend)
    idle = _quiet(b)
    assert [h.cancel() for h in group] == [True] * 4
    _after(b, idle)
    _healthy(b, backend)
    assert b.counts() == (1, 0, 0) and b.aborts_pending == 4
    b.resume()
    backend.run_free()
    assert queued.result(timeout=WAIT).token_ids == (30, 31)
    assert not set(backend.steps_after("resume")[0]) & {h.request_id for h in group}
    assert all(h.result().finish_reason == "abort" and len(h.result().token_ids) == 2 for h in group)
    _healthy(b, backend)
    _still_steps(b, backend)
    b.shutdown()


def test_cancel_during_the_suspend_call_is_applied_after_the_resume():
    backend = GatedBackend()
    b = _batcher(backend)
    a, other = b.submit([1], max_tokens=50), b.submit([20], max_tokens=5)
    backend.grant(1)
    backend.wait_steps(1)
    backend.hold("suspend")
    backend.wait_blocked()
    t = threading.Thread(target=b.suspend)
    t.start()
    assert b.wait_for_control(WAIT)
    backend.grant(1)  # the step in flight ends, then the suspend
    backend.wait_entered("suspend")  # the engine thread is inside backend.suspend()
    assert a.cancel() is True
    backend.release("suspend")
    t.join(WAIT)
    assert not t.is_alive()
    _quiet(b)  # the engine thread is past the suspend, with the cancel recorded
    _healthy(b, backend)
    assert b.counts() == (0, 0, 1) and a.request_id in backend.active_ids()
    b.resume()
    backend.run_free()
    assert other.result(timeout=WAIT).finish_reason == "length"
    assert a.request_id not in backend.steps_after("resume")[0]
    assert a.result().finish_reason == "abort" and a.result().token_ids == (1, 2)
    _healthy(b, backend)
    _still_steps(b, backend)
    b.shutdown()


def test_cancel_during_the_resume_call_is_applied_before_the_first_step():
    backend = GatedBackend()
    b = _batcher(backend)
    a, other = b.submit([1], max_tokens=50), b.submit([20], max_tokens=5)
    backend.grant(1)
    backend.wait_steps(1)
    _suspend_parked(b, backend)
    backend.hold("resume")
    t = threading.Thread(target=b.resume)
    t.start()
    backend.wait_entered("resume")
    assert a.cancel() is True
    backend.release("resume")
    t.join(WAIT)
    assert not t.is_alive()
    backend.run_free()
    assert other.result(timeout=WAIT).finish_reason == "length"
    assert a.request_id not in backend.steps_after("resume")[0]
    assert a.result().finish_reason == "abort"
    _healthy(b, backend)
    _still_steps(b, backend)
    b.shutdown()


def test_cancel_racing_shutdown_resolves_each_request_exactly_once():
    backend = GatedBackend()
    b = _batcher(backend, max_active_requests=2)
    parked = [b.submit([1], max_tokens=50), b.submit([2], max_tokens=50)]
    queued = b.submit([3], max_tokens=50)
    seen = [_resolutions(h) for h in (*parked, queued)]
    backend.grant(1)
    backend.wait_steps(1)
    _suspend_parked(b, backend)
    idle = _quiet(b)
    assert parked[0].cancel() is True  # recorded while suspended; shutdown comes before any resume
    _after(b, idle)
    _healthy(b, backend)
    backend.hold("shutdown")
    t = threading.Thread(target=b.shutdown)
    t.start()
    backend.wait_entered("shutdown")  # every request is already answered "abort" by now
    assert parked[1].cancel() is False and queued.cancel() is False
    backend.release("shutdown")
    t.join(WAIT)
    assert not t.is_alive()
    assert seen == [["abort"], ["abort"], ["abort"]]
    assert b.completed == 3 and b.aborts_pending == 0
    assert backend.violations == [] and b.steps_while_suspended == 0
    assert [e for e in backend.log if e[0] == "abort"] == []  # nothing was aborted on the suspended engine


def test_tensor_parallel_pair_applies_a_parked_cancel_after_the_resume_on_both_ranks():
    """With a lockstep the leader plans the abort: never while suspended, and both ranks drop the row together."""
    from tests.support.properties import ThreadLockstep

    shared, slot = threading.Barrier(2), [None]
    backends = [GatedBackend(), GatedBackend()]
    ranks = [ContinuousBatcher(lambda r=r: backends[r], lockstep=ThreadLockstep(shared, slot, r)) for r in (0, 1)]

    def both(call: str) -> None:
        run_calls([getattr(b, call) for b in ranks], backends, step_in_flight=call == "suspend")

    both("start")
    handles = [[b.submit([1], max_tokens=40), b.submit([20], max_tokens=6)] for b in ranks]
    for be in backends:
        be.grant(2)
    for be in backends:
        be.wait_steps(2)
    both("suspend")
    idle = _quiet(ranks[0])
    assert handles[0][0].cancel() is True and handles[1][0].cancel() is True  # the SPMD program cancels on both
    _after(ranks[0], idle)
    for b, be in zip(ranks, backends):
        _healthy(b, be)
    both("resume")
    for be in backends:
        be.run_free()
    for hs in handles:
        assert hs[0].result(timeout=WAIT).finish_reason == "abort"
        assert hs[1].result(timeout=WAIT).token_ids == (20, 21, 22, 23, 24, 25)
    assert backends[0].log == backends[1].log  # one schedule
    assert handles[0][0].request_id not in backends[0].steps_after("resume")[0]
    for b, be in zip(ranks, backends):
        _healthy(b, be)
        assert be.active_ids() == []
    ts = [threading.Thread(target=b.shutdown) for b in ranks]
    for t in ts:
        t.start()
    for t in ts:
        t.join(WAIT)


def test_tensor_parallel_pair_drops_a_queued_cancel_on_every_rank():
    """The leader's cancel of a queued request reaches the followers too: no copy stays queued there."""
    from tests.support.properties import ThreadLockstep

    shared, slot = threading.Barrier(2), [None]
    backends = [GatedBackend(free=True), GatedBackend(free=True)]
    ranks = [
        ContinuousBatcher(lambda r=r: backends[r], max_active_requests=1, lockstep=ThreadLockstep(shared, slot, r))
        for r in (0, 1)
    ]
    run_calls([b.start for b in ranks], backends, step_in_flight=False)
    for be in backends:
        be._free = False  # from here on, steps wait for grants
    handles = [[b.submit([1], max_tokens=4), b.submit([9], max_tokens=4)] for b in ranks]
    for be in backends:
        be.wait_blocked()  # the first step is in flight on both ranks: its admissions are done
    assert [b.counts() for b in ranks] == [(1, 1, 0), (1, 1, 0)]
    assert [h[1].cancel() for h in handles] == [True, True]  # the queued one, on both ranks (SPMD)
    for be in backends:
        be.run_free()
    for hs in handles:
        assert hs[0].result(timeout=WAIT).token_ids == (1, 2, 3, 4)
        assert hs[1].result(timeout=WAIT).finish_reason == "abort"
    for b in ranks:
        _quiet(b)
    assert [b.counts() for b in ranks] == [(0, 0, 0), (0, 0, 0)]
    assert backends[0].log == backends[1].log
    run_calls([b.shutdown for b in ranks], backends, step_in_flight=False)
