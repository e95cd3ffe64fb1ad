"""The dynamic engine's step profile: kinds of step, their time and request counts, and windows over them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from colo_fsm.adapters.megatron.step_profile import KINDS, StepProfile, record_dynamic_step, window


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
    assert w["decode_graph"] == pytest.approx({"steps": 2, "share": 0.5, "ms_per_step": 5.0, "mean_active": 8})
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
