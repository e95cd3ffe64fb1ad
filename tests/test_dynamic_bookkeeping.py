"""The dynamic backend's per-step bookkeeping reads only what each engine step produced (O(new tokens)).

Driven on the CPU with megatron-core's own request record classes (``DynamicInferenceRequest`` in a
``DynamicInferenceRequestRecord``, checkpointed as a recompute-mode resume does), filled step by step as the
dynamic engine fills them.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from colo_fsm.adapters.megatron.dynamic import RecordCursor, outputs_from_records, record_tokens

pytest.importorskip("megatron.core.inference.inference_request")
from megatron.core.inference.inference_request import (
    DynamicInferenceRequest,
    DynamicInferenceRequestRecord,
    Status,
)
from megatron.core.inference.sampling_params import SamplingParams

EOD = 0


class CountingList(list):
    """A list that counts the elements read through iteration and slicing (what a rebuild would touch)."""

    read = 0

    def __iter__(self):
        CountingList.read += len(self)
        return super().__iter__()

    def __getitem__(self, i):
        out = super().__getitem__(i)
        CountingList.read += len(out) if isinstance(i, slice) else 1
        return out


def _record(rid: int, prompt_len: int = 3) -> DynamicInferenceRequestRecord:
    req = DynamicInferenceRequest(
        request_id=rid,
        prompt_tokens=torch.arange(1, prompt_len + 1),
        sampling_params=SamplingParams(num_tokens_to_generate=100_000, return_log_probs=True),
    )
    req.generated_log_probs = []
    return DynamicInferenceRequestRecord.from_request(req)


def _emit(record: DynamicInferenceRequestRecord, toks: list[int]) -> None:
    """What the engine's bookkeeping does in one step: append tokens and their log-probs to the last request."""
    r = record[-1]
    r.generated_tokens += toks
    if r.generated_log_probs is None:
        r.generated_log_probs = []
    r.generated_log_probs.extend(-0.01 * t for t in toks)


def test_cursor_reads_every_token_once_across_recompute_checkpoints():
    rng = random.Random(7)
    records = {rid: _record(rid) for rid in range(4)}
    tracked = {rid: RecordCursor() for rid in records}
    got: dict[int, list[int]] = {rid: [] for rid in records}
    lps: dict[int, list[float]] = {rid: [] for rid in records}
    for step in range(300):
        for rid, rec in records.items():
            if rid in tracked and rng.random() < 0.8:
                _emit(rec, [rng.randrange(1, 50) for _ in range(rng.choice((1, 1, 2, 3)))])
        if step % 37 == 36:  # a recompute-mode suspend: every active request is checkpointed
            for rid in tracked:
                records[rid].checkpoint()
                records[rid][-1].generated_log_probs = []
        finished = []
        if step in (100, 299):  # one ends with an end-of-document token, then the others at the end
            for rid in list(tracked) if step == 299 else [2]:
                _emit(records[rid], [EOD] if rid == 2 else [])
                records[rid][-1].status = Status.COMPLETED
                finished.append(records[rid])
        live = {rid: records[rid] for rid in tracked}
        for o in outputs_from_records(tracked, live, finished, EOD):
            got[o.request_id] += o.token_ids
            lps[o.request_id] += o.logprobs
            if o.finished is not None:
                assert o.finished == ("stop" if o.request_id == 2 else "length")
    assert tracked == {}
    for rid, rec in records.items():
        want_t, want_lp = record_tokens(rec)  # the full rebuild: what the cursor must agree with
        assert got[rid] == want_t and len(rec.requests) == 9 - (rid == 2) * 6
        assert lps[rid] == pytest.approx(want_lp)
        assert not any(math.isnan(x) for x in lps[rid])


def test_per_step_bookkeeping_reads_only_the_new_tokens():
    rec = _record(1)
    rec[-1].generated_tokens = CountingList()
    rec[-1].generated_log_probs = CountingList()
    tracked = {1: RecordCursor()}
    steps = 2000
    CountingList.read = 0
    for _ in range(steps):
        _emit(rec, [5])
        (out,) = outputs_from_records(tracked, {1: rec}, [], EOD)
        assert out.token_ids == (5,)
    # one token and one log-prob per step; a rebuild of the whole list each step would read ~steps**2 of them
    assert CountingList.read == 2 * steps
    assert tracked[1].reported == steps


LOG_PROBS = {  # what megatron may hold as a request's generated log-probs, for two generated tokens
    "none": lambda: None,
    "empty": lambda: [],
    "shorter-than-the-tokens": lambda: [-0.5],
    "both": lambda: [-0.5, -0.25],
    "a-tensor": lambda: torch.tensor([-0.5, -0.25]),
}


@pytest.mark.parametrize("log_probs", sorted(LOG_PROBS))
def test_the_one_token_step_reads_what_the_general_reading_does(log_probs):
    """A step that appended one token takes a shorter path (most steps do); it gives what reading the record in
    full gives, ``nan`` where megatron has no log-prob for a token, and a tensor field goes the general way."""
    rec = _record(1)
    r = rec[-1]
    r.generated_tokens = [4, 9]
    r.generated_log_probs = LOG_PROBS[log_probs]()
    cursor = RecordCursor(offset=1, reported=1, last_token=4)
    toks, lps, tops = cursor.advance(rec)
    want_t, want_lp = record_tokens(rec)
    assert toks == want_t[1:] == [9] and tops == []
    assert (math.isnan(lps[0]) and math.isnan(want_lp[1])) or lps == pytest.approx(want_lp[1:])
    assert (cursor.offset, cursor.reported, cursor.last_token) == (2, 2, 9)
    assert cursor.advance(rec) == ([], [], [])  # nothing new: nothing read twice
