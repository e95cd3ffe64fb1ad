"""The dynamic engine's step profile: kinds of step, their time and request counts, and windows over them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from colo_fsm.adapters.megatron.step_profile import (
    KINDS,
    MISS_MARGIN,
    LoopCheck,
    StepProfile,
    profile_async_steps,
    record_dynamic_step,
    record_step_safely,
    totals,
    window,
)


def _engine(decode_only, total=10, paused=2, waiting=(1, 2, 3)):
    ctx = SimpleNamespace(total_request_count=total, paused_request_count=paused)
    return SimpleNamespace(decode_only=decode_only, context=ctx, waiting_request_ids=list(waiting))


def test_each_step_is_counted_by_its_kind_with_its_time_and_requests():
    p = StepProfile()
    record_dynamic_step(p, _engine(True), {"cuda_graph_request_count": 16}, 0.004)
    record_dynamic_step(p, _engine(True), {"cuda_graph_request_count": 16}, 0.006)
    record_dynamic_step(p, _engine(False, total=20, paused=0, waiting=()), {"cuda_graph_request_count": None}, 0.02)
    record_dynamic_step(p, SimpleNamespace(), {}, 0.001)  # megatron said nothing: counted, as "unknown"
    w = window({}, p.snapshot())
    assert w["steps"] == 4 and set(w) - {"steps", "mean_paused", "mean_waiting"} == {
        "decode_graph",
        "mixed_eager",
        "unknown",
    }
    graphs = w["decode_graph"].pop("graphs")
    assert w["decode_graph"] == pytest.approx({"steps": 2, "share": 0.5, "ms_per_step": 5.0, "mean_active": 8})
    assert graphs == {"16": pytest.approx({"steps": 2, "share": 1.0, "ms_per_step": 5.0})}
    assert w["mixed_eager"]["mean_active"] == 20 and w["mixed_eager"]["ms_per_step"] == pytest.approx(20.0)
    assert w["mean_paused"] == pytest.approx(4 / 4) and w["mean_waiting"] == pytest.approx(6 / 4)


def test_a_window_is_the_difference_of_two_snapshots():
    p = StepProfile()
    p.add("mixed_graph", 0.010, 100, 0, 5)
    before = p.snapshot()
    p.add("decode_eager", 0.030, 50, 1, 0)
    w = window(before, p.snapshot())
    assert w["steps"] == 1 and "mixed_graph" not in w and w["decode_eager"]["ms_per_step"] == pytest.approx(30.0)
    assert window(before, before) == {"steps": 0}
    with pytest.raises(ValueError, match="kind 'prefill'"):
        p.add("prefill", 0.0, 0, 0, 0)
    assert len(KINDS) == 5


def test_megatron_decode_only_pair_is_read_by_its_consumed_forward():
    """megatron-core 0.19.2's ``DecodeOnly`` raises on ``bool()`` when its consumed and launched forwards differ (the
    asynchronous schedule); the profile reads the consumed one and never fails the step."""
    mc = pytest.importorskip("megatron.core.inference.text_generation_controllers.text_generation_controller")
    pair = mc.DecodeOnly
    with pytest.raises(ValueError):
        bool(pair(consumed=True, launched=False))
    p = StepProfile()
    record_dynamic_step(p, _engine(pair(consumed=True, launched=False)), {"cuda_graph_request_count": 16}, 0.004)
    record_dynamic_step(p, _engine(pair(consumed=False, launched=True)), {"cuda_graph_request_count": None}, 0.02)
    record_dynamic_step(p, _engine(pair(consumed=None, launched=None)), {"cuda_graph_request_count": None}, 0.001)
    w = window({}, p.snapshot())
    assert {k: w[k]["steps"] for k in KINDS if k in w} == {"decode_graph": 1, "mixed_eager": 1, "unknown": 1}


def test_graph_steps_are_counted_per_captured_graph_with_the_requests_they_decoded():
    """A step's ``cuda_graph_request_count`` is the captured graph it ran: 65 requests on the 128 graph show as
    graph 128 decoding 65, so the padding can be read off a run; eager steps have no graph."""
    p = StepProfile()

    def step(graph, ran, ms, decode_only=True):
        result = {
            "active_request_ids": list(range(ran - 1)),
            "finished_request_records": ["done"],
            "cuda_graph_request_count": graph,
        }
        record_dynamic_step(p, _engine(decode_only), result, ms / 1e3)

    step(128, 65, 10.0)
    step(128, 67, 12.0)
    step(64, 40, 7.0)
    step(None, 30, 20.0, decode_only=False)
    step(32, 20, 15.0, decode_only=False)  # a mixed graph: its request count is shared by graphs of other sizes
    w = window({}, p.snapshot())
    assert "graphs" not in w["mixed_graph"] and w["mixed_graph"]["mean_ran"] == 20
    dg = w["decode_graph"]
    assert dg["steps"] == 3 and dg["mean_ran"] == pytest.approx((65 + 67 + 40) / 3)
    assert list(dg["graphs"]) == ["64", "128"]  # smallest first, keys as JSON keeps them
    assert dg["graphs"]["128"] == pytest.approx({"steps": 2, "share": 2 / 3, "ms_per_step": 11.0, "mean_ran": 66})
    assert dg["graphs"]["64"] == pytest.approx({"steps": 1, "share": 1 / 3, "ms_per_step": 7.0, "mean_ran": 40})
    assert "graphs" not in w["mixed_eager"] and w["mixed_eager"]["mean_ran"] == 30
    # a result that does not say what ran: counted, no mean_ran made up
    q = StepProfile()
    record_dynamic_step(q, _engine(True), {"cuda_graph_request_count": 16}, 0.004)
    wq = window({}, q.snapshot())["decode_graph"]
    assert "mean_ran" not in wq and wq["graphs"] == {
        "16": pytest.approx({"steps": 1, "share": 1.0, "ms_per_step": 4.0})
    }
    with pytest.raises(ValueError, match="graph 0"):
        q.add("decode_graph", 0.0, 0, 0, 0, graph=0)


def test_profile_async_steps_times_every_step_the_loop_awaits_and_refuses_a_second_wrap():
    """megatron's coordinator loop awaits ``engine.async_step()`` each step: the wrapper set on the engine object
    records each one (kind, graph, requests) and returns megatron's result untouched."""
    import asyncio

    class Engine(SimpleNamespace):
        async def async_step(self):
            await asyncio.sleep(0)
            return {"active_request_ids": [1, 2], "finished_request_records": [], "cuda_graph_request_count": 2}

    eng = Engine(decode_only=True, context=SimpleNamespace(total_request_count=2, paused_request_count=0))
    p = StepProfile()
    profile_async_steps(eng, p)

    async def loop():
        return [await eng.async_step() for _ in range(3)]

    results = asyncio.run(loop())
    assert results[0]["cuda_graph_request_count"] == 2
    w = window({}, p.snapshot())
    assert w["steps"] == 3 and w["decode_graph"]["graphs"]["2"]["steps"] == 3 and w["decode_graph"]["mean_ran"] == 2
    with pytest.raises(ValueError, match="already profiled"):
        profile_async_steps(eng, p)


def test_megatrons_coordinator_loop_counts_only_what_the_wrappers_see():
    """The coordinator path's profile wraps ``engine.async_step`` and ``engine.controller.dummy_forward`` on their
    objects, and :class:`LoopCheck` compares megatron's step count with what they saw. Both hold only while the
    installed megatron-core's loop awaits ``self.async_step()`` for a step and its step count changes only where
    read here: once in the step's forward, once after each of the loop's two dummy forwards, and set to 0 where the
    context is made and reset. Every write to it in megatron's inference package is pinned, so an upgrade that
    steps or counts some other way fails here."""
    import inspect
    import re
    from pathlib import Path

    engines = pytest.importorskip("megatron.core.inference.engines.dynamic_engine", reason="megatron-core")
    loop = [
        ln.split("#")[0]
        for ln in inspect.getsource(engines.DynamicInferenceEngine.run_engine_with_coordinator).splitlines()
    ]
    assert any("await self.async_step()" in ln for ln in loop)
    assert not any(call in ln for ln in loop for call in ("self.step(", "self.step_modern(", "async_forward("))
    counted = [i for i, ln in enumerate(loop) if "step_count +=" in ln]
    assert len(counted) == 2, "megatron's loop counts its steps in more places than its two dummy forwards"
    for i in counted:
        assert any("self.controller.dummy_forward()" in ln for ln in loop[max(0, i - 8) : i]), loop[i]
    package = Path(engines.__file__).resolve().parents[1]
    writes = sorted(
        (path.relative_to(package).as_posix(), m.group(1), m.group(2).strip())
        for path in package.rglob("*.py")
        for ln in path.read_text().splitlines()
        if (m := re.search(r"\b(\w*\.?)step_count\s*(\+=|=)\s*(?!=)", ln.split("#")[0]))
        and not re.search(r"\w_step_count|step_count_", ln)
    )
    assert writes == [
        ("contexts/dynamic_context.py", "self.", "="),
        ("contexts/dynamic_context.py", "self.", "="),
        ("engines/dynamic_engine.py", "context.", "+="),
        ("engines/dynamic_engine.py", "context.", "+="),
        ("engines/dynamic_engine.py", "context.", "+="),
    ], writes
    forward = inspect.getsource(engines.DynamicInferenceEngine.async_forward)
    assert forward.count("self.context.step_count += 1") == 1  # the step's own count, before it returns


def test_profile_async_steps_counts_the_loops_dummy_forwards_apart_from_its_steps():
    """An idle expert-parallel rank's dummy forwards (megatron's loop calls ``engine.controller.dummy_forward()``)
    are counted, not as steps: they decode none of this rank's requests."""
    calls = []
    eng = SimpleNamespace(controller=SimpleNamespace(dummy_forward=lambda: calls.append(1) or "ran"))

    async def async_step():
        return {}

    eng.async_step = async_step
    p = StepProfile()
    profile_async_steps(eng, p)
    assert [eng.controller.dummy_forward() for _ in range(3)] == ["ran"] * 3 and len(calls) == 3
    assert p.snapshot() == {"dummy_forwards": 3}
    w = window({}, p.snapshot())
    assert w["steps"] == 0 and w["dummy_forwards"] == 3


def _reads(count, snapshot):
    return (lambda: count), (lambda: snapshot)


def test_the_loop_check_tells_a_miss_from_a_step_under_way_a_dummy_forward_and_a_reset():
    """megatron counts a step before it returns through the wrapper, so the count may run ahead of the profile by
    the margin with nothing missed; dummy forwards and failed records were seen; a count that drops is megatron
    capturing its graphs again, and a miss after it is still told; a miss is told once."""
    assert MISS_MARGIN == 2
    check = LoopCheck(count_at_wrap=5)  # 5 dummy forwards before the wrappers were set: not this check's
    assert check.check(*_reads(6, {})) == ({}, None) and check.check(*_reads(7, {}))[1] is None  # under way
    seen = {"steps": 20, "dummy_forwards": 3, "record_errors": 2}
    assert check.check(*_reads(30, seen)) == (seen, None)
    after = {"steps": 24, "dummy_forwards": 3, "record_errors": 2}
    assert check.check(*_reads(4, after))[1] is None  # a reset read as a lower count: 4 steps since it
    assert check.check(*_reads(14, after))[1] == 10  # 10 past the wrapper
    assert check.check(*_reads(20, after))[1] is None  # told already
    quiet = LoopCheck(0)
    assert quiet.check(*_reads(MISS_MARGIN, {}))[1] is None
    assert quiet.check(*_reads(MISS_MARGIN + 1, {}))[1] == MISS_MARGIN + 1


def test_a_resume_that_recaptures_graphs_loses_no_step_where_the_engine_holds_the_loop_still():
    """The engine tells the check megatron's count at SUSPENDED and again after the resume (where a graph
    re-capture set it to 0): every step is counted across it, so a later miss is told at its true size. Read only
    as a lower count, the steps before the reset would be lost, and a miss hidden by as many."""
    held = LoopCheck(0)
    assert held.check(*_reads(100, {"steps": 100}))[1] is None
    held.hold(130)  # 30 more steps, then SUSPENDED
    held.restart(0)  # megatron captured its graphs again
    assert held.check(*_reads(5, {"steps": 135}))[1] is None
    assert held.check(*_reads(12, {"steps": 138}))[1] == 4  # 4 steps past the wrapper, told as 4
    past = LoopCheck(0)  # the loop runs past the held count before the next read: only the restart tells
    past.hold(130)
    past.restart(0)
    assert past.check(*_reads(140, {"steps": 270}))[1] is None
    assert past.check(*_reads(143, {"steps": 270}))[1] == 3
    guessed = LoopCheck(0)
    assert guessed.check(*_reads(100, {"steps": 100}))[1] is None
    assert guessed.check(*_reads(12, {"steps": 138}))[1] is None  # the 30 before the reset lost: the 4 hidden


def test_two_readers_never_apply_an_older_count_after_a_newer_one():
    """Forced: reader A reads megatron's count (110) and stalls before applying it while the loop runs 40 steps
    and reader B comes. B waits for A, so A's 110 is never applied after B's 150 (read as a reset, it would add 110
    steps that were never missed)."""
    import threading

    check = LoopCheck(0)
    a_inside, release = threading.Event(), threading.Event()

    def stalled_snapshot():
        a_inside.set()
        assert release.wait(30)
        return {"steps": 109}

    said = []
    a = threading.Thread(target=lambda: said.append(check.check(lambda: 110, stalled_snapshot)[1]))
    b = threading.Thread(target=lambda: said.append(check.check(lambda: 150, lambda: {"steps": 149})[1]))
    a.start()
    assert a_inside.wait(30)
    b.start()
    b.join(0.2)  # B has the time to run through, were A's read not held under the check's lock
    release.set()
    a.join(30)
    b.join(30)
    assert said == [None, None], said


def test_a_request_megatron_failed_at_admission_is_not_counted_as_decoded():
    """megatron-core 0.19.2 hands back a request it failed at admission with the next step's finished records; it
    never ran, so ``mean_ran`` leaves it out."""
    failed = SimpleNamespace(requests=[SimpleNamespace(status=SimpleNamespace(name="FAILED"))])
    done = SimpleNamespace(requests=[SimpleNamespace(status=SimpleNamespace(name="COMPLETED"))])
    p = StepProfile()
    result = {
        "active_request_ids": [1, 2, 3],
        "finished_request_records": [done, failed],
        "cuda_graph_request_count": 4,
    }
    record_dynamic_step(p, _engine(True), result, 0.005)
    assert window({}, p.snapshot())["decode_graph"]["graphs"]["4"]["mean_ran"] == 4


def test_a_step_that_cannot_be_recorded_still_runs_and_is_counted_and_logged_once(caplog):
    """The profile is a diagnostic: a record that raises is counted (``record_errors``) and logged once, and the
    engine's step (here megatron's loop awaiting the wrapped ``async_step``) gets its result as if unprofiled."""
    import asyncio
    import logging

    class Broken:
        @property
        def total_request_count(self):
            raise RuntimeError("context gone")

    class Engine(SimpleNamespace):
        async def async_step(self):
            return {"active_request_ids": [1], "finished_request_records": [], "cuda_graph_request_count": 1}

    eng = Engine(decode_only=True, context=Broken())
    p = StepProfile()
    profile_async_steps(eng, p)

    async def loop():
        return [await eng.async_step() for _ in range(2)]

    with caplog.at_level(logging.ERROR):
        try:
            results = asyncio.run(loop())
        except RuntimeError as exc:
            pytest.fail(f"a failed record reached megatron's loop: {exc}")
    assert [r["active_request_ids"] for r in results] == [[1], [1]]
    assert window({}, p.snapshot()) == {"steps": 0, "record_errors": 2}
    said = "step profile: a step could not be recorded (counted in record_errors; the step ran)"
    assert sum(said in r.getMessage() for r in caplog.records) == 1  # a log context may prefix it
    record_step_safely(p, eng, {}, 0.0)  # the direct path's call: the same guard
    assert window({}, p.snapshot())["record_errors"] == 3


def test_totals_are_the_running_sums_counters_read():
    """``totals`` gives per kind its steps and seconds, per captured decode-only graph its steps, seconds and
    requests decoded, and the record errors: sums that only grow, as Prometheus counters need."""
    p = StepProfile()
    p.add("decode_graph", 0.010, 65, 0, 0, ran=65, graph=128)
    p.add("decode_graph", 0.004, 16, 0, 0, ran=16, graph=16)
    p.add("mixed_graph", 0.020, 80, 0, 0, ran=80)
    with pytest.raises(ValueError, match="only decode_graph steps are split by graph"):
        p.add("mixed_graph", 0.020, 80, 0, 0, ran=80, graph=96)
    p.record_error()
    t = totals(p.snapshot())
    assert t["kinds"] == {
        "decode_graph": {"steps": 2, "seconds": pytest.approx(0.014)},
        "mixed_graph": {"steps": 1, "seconds": pytest.approx(0.020)},
    }
    assert list(t["graphs"]) == ["16", "128"]
    assert t["graphs"]["128"] == {"steps": 1, "seconds": pytest.approx(0.010), "requests": 65}
    assert t["record_errors"] == 1 and totals({}) == {"kinds": {}, "graphs": {}, "record_errors": 0}
