"""``inflight="abort"``: the peers' colocated-async handoff (end the requests at the suspend, resubmit after).

Each request in flight is ended in the backend at the suspend and queued again as prompt + the tokens it had;
after the resume it is re-prefilled under the new weights and continues to the same ``max_tokens`` total. Its
caller gets one completion with every token, each stamped with the weight version that generated it.
"""

from __future__ import annotations

import threading

import pytest

from colo_fsm.adapters.batching import ContinuousBatcher, InflightPolicy, parse_inflight
from colo_fsm.adapters.megatron.engine import GenerationConfig
from colo_fsm.collector.collector import parse_inflight as collector_inflight
from colo_fsm.errors import ConfigError
from tests.support.gated import WAIT, GatedBackend, run_calls


def _suspend(b: ContinuousBatcher, backend: GatedBackend) -> None:
    """Suspend right after the decode step in flight."""
    run_calls([b.suspend], [backend], step_in_flight=True)


def test_abort_ends_requests_at_the_suspend_and_resubmits_prompt_plus_tokens_after_the_resume():
    backend, version = GatedBackend(), [0]
    b = ContinuousBatcher(lambda: backend, weight_version=lambda: version[0], inflight="abort")
    b.start()
    b.suspend()  # both wait in the queue, so the resume admits them in one step whatever the load
    a, short = b.submit([1], max_tokens=10), b.submit([20], max_tokens=3)
    b.resume()
    backend.grant(2)
    backend.wait_steps(2)
    _suspend(b, backend)
    assert short.result(timeout=0).token_ids == (20, 21, 22)  # it finished in the step before the suspend
    assert backend.active_ids() == []  # nothing kept in the engine through the handoff
    assert backend.log[-2:] == [("abort", a.request_id), ("suspend",)]
    assert b.counts() == (1, 0, 0)  # waiting to be resubmitted
    version[0] = 1  # the training step
    b.resume()
    backend.run_free()
    c = a.result(timeout=WAIT)
    assert c.finish_reason == "length" and c.token_ids == tuple(range(1, 11))  # the same max_tokens total
    assert c.prompt_ids == (1,)  # the caller's prompt, not the resubmitted one
    assert c.weight_versions == (0, 0, 0) + (1,) * 7
    assert (c.first_weight_version, c.last_weight_version, c.weight_version) == (0, 1, 0)  # oldest counts for age
    assert c.resubmissions == 1 and len(c.logprobs) == 10
    again = backend.added[-1]
    assert again.prompt_ids == (1, 1, 2, 3) and again.max_tokens == 7 and again.request_id != a.request_id
    assert (b.reprefills, b.reprefill_tokens) == (1, 4)  # the re-prefill is counted
    assert b.inflight_stats() == (1, 4, 1, 4)  # ended once, its prompt + 3 tokens of KV discarded, re-prefilled
    assert b.steps_while_suspended == 0 and backend.violations == []
    assert b.counts() == (0, 0, 0) and b.completed == 2
    b.shutdown()


def test_a_request_cancelled_while_waiting_for_resubmission_is_never_added_again():
    backend = GatedBackend()
    b = ContinuousBatcher(lambda: backend, inflight="abort")
    b.start()
    a = b.submit([1], max_tokens=10)
    backend.grant(1)
    backend.wait_steps(1)
    _suspend(b, backend)
    assert a.cancel() is True
    assert a.result(timeout=0).finish_reason == "abort" and a.result().token_ids == (1, 2)
    b.resume()
    backend.run_free()
    assert b.submit([30], max_tokens=2).result(timeout=WAIT).token_ids == (30, 31)
    assert [r.request_id for r in backend.added].count(a.request_id) == 1 and len(backend.added) == 2
    assert b.reprefills == 0 and b.counts() == (0, 0, 0)
    b.shutdown()


def test_abort_mode_on_a_tensor_parallel_pair_keeps_one_schedule():
    from tests.support.properties import ThreadLockstep

    shared, slot = threading.Barrier(2), [None]
    backends = [GatedBackend(), GatedBackend()]
    ranks = [
        ContinuousBatcher(lambda r=r: backends[r], inflight="abort", lockstep=ThreadLockstep(shared, slot, r))
        for r in (0, 1)
    ]

    def both(call: str) -> None:
        run_calls([getattr(b, call) for b in ranks], backends, step_in_flight=call == "suspend")

    both("start")
    hs = [b.submit([1], max_tokens=8) for b in ranks]
    for be in backends:
        be.grant(2)
    for be in backends:
        be.wait_steps(2)
    both("suspend")
    both("resume")
    for be in backends:
        be.run_free()
    assert [h.result(timeout=WAIT).token_ids for h in hs] == [tuple(range(1, 9))] * 2
    assert backends[0].log == backends[1].log and backends[0].added == backends[1].added
    assert all(h.result().resubmissions == 1 for h in hs)
    ts = [threading.Thread(target=b.shutdown) for b in ranks]
    for t in ts:
        t.start()
    for t in ts:
        t.join(WAIT)


@pytest.mark.parametrize(
    ("raw", "policy"),
    [("park", "park"), ("keep", "park"), ("DRAIN", "drain"), ("wait", "drain"), ("abort", "abort")],
)
def test_inflight_names_and_aliases(raw, policy):
    assert parse_inflight(raw) is InflightPolicy(policy)
    assert GenerationConfig(inflight=raw).inflight == policy
    assert collector_inflight(raw) == policy


@pytest.mark.parametrize("bad", ["pause", "", None, 3, "parked"])
def test_a_bad_inflight_value_is_a_typed_error_naming_the_field_and_the_choices(bad):
    for parse in (parse_inflight, collector_inflight, lambda v: GenerationConfig(inflight=v)):
        with pytest.raises(ConfigError) as exc:
            parse(bad)
        assert exc.value.field == "inflight"
        assert all(name in str(exc.value) for name in ("park", "drain", "abort", "keep", "wait"))


def test_the_policy_switches_only_while_the_engine_holds_no_request():
    """One built engine serves every policy in turn (a benchmark compares them on one engine): the switch is
    refused while a request is queued or admitted, since it would change the promise that request was admitted
    with."""
    from colo_fsm.errors import LifecycleError

    backend = GatedBackend()
    b = ContinuousBatcher(lambda: backend, inflight="park")
    b.start()
    a = b.submit([1], max_tokens=3)
    with pytest.raises(LifecycleError, match=r"set_inflight\('abort'\) with 1 request"):
        b.set_inflight("abort")
    assert b.inflight is InflightPolicy.PARK
    backend.grant(3)
    a.result(timeout=WAIT)
    b.set_inflight("wait")
    assert b.inflight is InflightPolicy.DRAIN
    with pytest.raises(ConfigError, match="inflight"):
        b.set_inflight("stop")
    b.set_inflight("abort")
    c = b.submit([5], max_tokens=6)
    backend.grant(1)
    backend.wait_steps(4)
    _suspend(b, backend)
    assert b.inflight_stats().ended == 1  # the new policy acts at the next suspend
    b.resume()
    backend.run_free()
    assert c.result(timeout=WAIT).resubmissions == 1
    b.shutdown()


def test_a_recompute_resume_does_not_re_prefill_a_request_ended_at_the_suspend():
    """megatron-core's RECOMPUTE suspend checkpoints every active request for the resume, the ones an abort just
    marked finished too: they are taken off the resume list (their futures cancelled), not re-prefilled to be
    finished at the next step."""
    import concurrent.futures
    from types import SimpleNamespace

    from colo_fsm.adapters.megatron.dynamic import drop_finished_from_resume

    def entry():
        return SimpleNamespace(future=concurrent.futures.Future())

    engine = SimpleNamespace(
        stop_word_finished_request_ids={1, 3},
        resume_request_ids=[0, 1, 2, 3],
        requests={0: entry(), 1: entry(), 2: entry(), 3: entry()},
    )
    ended = {1: engine.requests[1], 3: engine.requests[3]}
    assert drop_finished_from_resume(engine) == [1, 3]
    assert engine.resume_request_ids == [0, 2] and sorted(engine.requests) == [0, 2]
    assert engine.stop_word_finished_request_ids == set() and all(e.future.cancelled() for e in ended.values())
    persist = SimpleNamespace(stop_word_finished_request_ids={4}, resume_request_ids=None, requests={})
    assert drop_finished_from_resume(persist) == [] and persist.stop_word_finished_request_ids == {4}
