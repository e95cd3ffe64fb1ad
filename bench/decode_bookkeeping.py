"""Per-step decode bookkeeping of the dynamic backend: the full rebuild, the cursor's general reading and the
cursor as shipped, on CPU.

After every ``step_modern()`` the dynamic backend reads each active request's new tokens and log-probs off its
``DynamicInferenceRequestRecord``. The old reading rebuilt every request's whole token and log-prob lists each
step (cost grows with the tokens generated so far); :class:`~colo_fsm.adapters.megatron.dynamic.RecordCursor`
reads only what that step appended: in general by slicing each request from where it stands (``general``), and
for a step that appended one token to Python lists, most steps, without building slices (``new``, as shipped).
All three run here on megatron-core's own record classes, filled the way the engine fills them: ``--requests``
active requests, each already holding ``L`` generated tokens (split over two requests of its record, as after a
recompute-mode resume), then timed engine steps that append one token per request and run the bookkeeping. The
variants interleave round by round in one process, the order rotating; the table reports the median
milliseconds per engine step and the ratios old/new and general/new for each ``L``.

Usage::

    python bench/decode_bookkeeping.py            # L = 100 .. 8000, 64 requests (about a minute)
    python bench/decode_bookkeeping.py --quick    # fewer steps and rounds, same output format
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from colo_fsm.adapters.batching import StepOutput  # noqa: E402
from colo_fsm.adapters.megatron.dynamic import (  # noqa: E402
    RecordCursor,
    outputs_from_records,
    record_status,
    record_tokens,
)

RESULTS = ROOT / "bench" / "results" / "decode_bookkeeping.json"
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "new ms/step at 100 tokens": "rows.0.new_ms_per_step",
    "new ms/step at 8000 tokens": "rows.5.new_ms_per_step",
    "old ms/step at 8000 tokens": "rows.5.old_ms_per_step",
    "general/new at 1000 tokens": "rows.2.ratio_general_vs_new",
    "new growth 8000 vs 100": "new_growth_8000_vs_100",
}
LENGTHS = (100, 500, 1000, 2000, 4000, 8000)
EOD = 0


def old_outputs(tracked: dict[int, int], live: dict[int, Any], finished: Sequence[Any], eod: int) -> list[StepOutput]:
    """The bookkeeping as it was: rebuild each request's whole token and log-prob lists, then cut the new ones."""
    out: list[StepOutput] = []
    done = {int(r.request_id): r for r in finished}
    for rid in list(tracked):
        record = done.get(rid, live.get(rid))
        if record is None:
            continue
        toks, lps = record_tokens(record)
        start = tracked[rid]
        new_t, new_lp = toks[start:], lps[start:]
        reason: str | None = None
        if rid in done:
            reason = "abort" if record_status(record) == "FAILED" else ("stop" if toks[-1] == eod else "length")
            del tracked[rid]
        else:
            tracked[rid] = len(toks)
        if new_t or reason is not None:
            out.append(StepOutput(rid, tuple(new_t), tuple(new_lp), reason))
    return out


def build_records(n_requests: int, generated: int) -> dict[int, Any]:
    """``n_requests`` megatron-core records, each with ``generated`` tokens over two checkpointed requests."""
    import torch
    from megatron.core.inference.inference_request import DynamicInferenceRequest, DynamicInferenceRequestRecord
    from megatron.core.inference.sampling_params import SamplingParams

    records = {}
    for rid in range(n_requests):
        req = DynamicInferenceRequest(
            request_id=rid,
            prompt_tokens=torch.arange(1, 65),
            sampling_params=SamplingParams(num_tokens_to_generate=1 << 20, return_log_probs=True),
        )
        rec = DynamicInferenceRequestRecord.from_request(req)
        first = generated // 2
        req.generated_tokens = [(rid + i) % 1000 + 1 for i in range(first)]
        req.generated_log_probs = [-0.5] * first
        rec.checkpoint()  # a recompute-mode resume: the rest goes into a second request of the record
        rest = generated - first
        rec[-1].generated_tokens = [(rid + i) % 1000 + 1 for i in range(first, generated)]
        rec[-1].generated_log_probs = [-0.5] * rest
        records[rid] = rec
    return records


def time_steps(records: dict[int, Any], steps: int, bookkeeping: Callable[[dict[int, Any]], Any]) -> list[float]:
    """Seconds per engine step: append one token (and log-prob) to every request, then run ``bookkeeping``."""
    out = []
    for _ in range(steps):
        for rec in records.values():  # the engine's own append (same for old and new; not timed)
            r = rec[-1]
            r.generated_tokens.append(7)
            r.generated_log_probs.append(-0.25)
        t = time.perf_counter()
        bookkeeping(records)
        out.append(time.perf_counter() - t)
    return out


class GeneralCursor(RecordCursor):
    """The cursor without its one-token path: every step read through :meth:`RecordCursor.read_new` (slices of
    each request from the cursor on), as every step was before that path."""

    def advance(self, record: Any, top_k: int = 0) -> tuple[list[int], list[float], list[Any]]:
        return self.read_new(record, top_k)


VARIANTS = ("old", "general", "new")
"""``old``: the full rebuild; ``general``: the cursor reading slices; ``new``: the cursor as shipped."""


def bookkeeping_of(which: str, records: dict[int, Any], length: int) -> Callable[[dict[int, Any]], Any]:
    """One variant's per-step bookkeeping over ``records`` (each already holding ``length`` tokens)."""
    if which == "old":
        tracked_old = dict.fromkeys(records, length)

        def run_old(recs: dict[int, Any]) -> Any:
            outs = old_outputs(tracked_old, recs, [], EOD)
            assert len(outs) == len(recs)
            return outs

        return run_old
    cursor = GeneralCursor if which == "general" else RecordCursor
    tracked = {rid: cursor(part=1, offset=length - length // 2, reported=length) for rid in records}

    def run_cursor(recs: dict[int, Any]) -> Any:
        outs = outputs_from_records(tracked, recs, [], EOD)
        assert len(outs) == len(recs)
        return outs

    return run_cursor


def measure(length: int, n_requests: int, steps: int, rounds: int) -> dict[str, Any]:
    """Median ms per engine step at ``length`` generated tokens, the variants interleaved over ``rounds`` (the
    order rotates every round)."""
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rnd in range(rounds):
        for which in VARIANTS[rnd % len(VARIANTS) :] + VARIANTS[: rnd % len(VARIANTS)]:
            records = build_records(n_requests, length)
            fn = bookkeeping_of(which, records, length)
            gc.collect()
            samples[which].extend(time_steps(records, steps, fn))
    ms = {v: statistics.median(samples[v]) * 1e3 for v in VARIANTS}
    return {
        "generated_tokens": length,
        "requests": n_requests,
        "old_ms_per_step": ms["old"],
        "general_ms_per_step": ms["general"],
        "new_ms_per_step": ms["new"],
        "ratio_old_vs_new": ms["old"] / ms["new"] if ms["new"] > 0 else float("inf"),
        "ratio_general_vs_new": ms["general"] / ms["new"] if ms["new"] > 0 else float("inf"),
        "samples_per_mode": len(samples["old"]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison, print the table and write ``bench/results/decode_bookkeeping.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and rounds (a few seconds)")
    p.add_argument("--requests", type=int, default=64, help="active requests per engine step (default 64)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    try:
        import megatron.core.inference.inference_request  # noqa: F401
    except ImportError as exc:
        print(f"decode_bookkeeping: megatron-core is not installed here ({exc}); nothing to measure")
        return 0
    steps, rounds = (10, 2) if args.quick else (30, 4)
    rows = [measure(n, args.requests, steps, rounds) for n in LENGTHS]
    first, last = rows[0], rows[-1]
    summary = {
        "new_growth_8000_vs_100": last["new_ms_per_step"] / first["new_ms_per_step"],
        "old_growth_8000_vs_100": last["old_ms_per_step"] / first["old_ms_per_step"],
    }
    print(f"decode bookkeeping per engine step, {args.requests} active requests (median of interleaved rounds)")
    print(
        f"{'generated':>10} {'old ms/step':>12} {'general ms/step':>16} {'new ms/step':>12} {'old/new':>8} {'general/new':>12}"
    )
    for r in rows:
        print(
            f"{r['generated_tokens']:>10} {r['old_ms_per_step']:>12.3f} {r['general_ms_per_step']:>16.3f} "
            f"{r['new_ms_per_step']:>12.3f} {r['ratio_old_vs_new']:>8.1f} {r['ratio_general_vs_new']:>12.2f}"
        )
    print(
        f"growth from 100 to 8000 tokens: old x{summary['old_growth_8000_vs_100']:.1f}, "
        f"new x{summary['new_growth_8000_vs_100']:.2f} (flat is x1)"
    )
    out = {
        "bench": "decode_bookkeeping",
        "provenance": prov,
        "rows": rows,
        **summary,
        "quick": args.quick,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
