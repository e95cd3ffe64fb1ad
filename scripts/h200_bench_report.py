"""Assemble the H200 benchmark results into one JSON with a top-level ``figures`` object (run on the CPU).

    python scripts/h200_bench_report.py --out docs/gpu-runs/2026-12-01-h200-bench.json \\
        --cuda-graph-decode R/cuda_graph_decode.json --resident R/resident_vs_rebuild.json ...

Every figure is reported as measured, with its target and whether it was met; a figure whose run is missing
is ``null`` with the reason under ``missing``. ``memory_budget_error_pct`` is computed here from the recorded
configuration of the measured run with :func:`colo_fsm.guards.memory.estimate` (when that module exists).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGETS = {
    "graphs_same_greedy": ("==", True),
    "graphs_decode_speedup": (">=", 1.5),
    "rebuild_over_resume_graphs": (">=", 100.0),
    "handoff_share_of_step": ("<=", 0.01),
    "park_over_sync": (">=", 1.3),
    "colocated_over_dedicated_decode": (">=", 0.9),
    "memory_budget_error_pct": ("<=", 20.0),
    # the reasoning workload (bench/inflight_handoff.py --workload reasoning), one run
    "reasoning_park_over_sync": (">=", 2.5),
    "reasoning_park_over_drain": (">=", 1.5),
    "reasoning_park_over_abort": (">=", 1.15),
    "reasoning_park_decode_over_graph_decode": (">=", 0.7),
}
REASONING_KEYS = {
    "reasoning_park_over_sync": "ratio_park_over_sync",
    "reasoning_park_over_drain": "ratio_park_over_drain",
    "reasoning_park_over_abort": "ratio_park_over_abort",
    "reasoning_park_decode_over_graph_decode": "ratio_park_decode_over_graph_decode",
}


def load(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def met(name: str, value: Any) -> bool | None:
    if value is None:
        return None
    op, target = TARGETS[name]
    if op == "==":
        return bool(value == target)
    if name == "memory_budget_error_pct":
        return abs(value) <= target
    return bool(value >= target) if op == ">=" else bool(value <= target)


def memory_prediction(mem: dict[str, Any], kv_mode: str = "persist") -> dict[str, Any]:
    """The guards' estimate for the recorded run, against its measured peak."""
    from colo_fsm.guards.memory import MemoryBudget, TrainingShape, estimate

    c = mem["config"]
    half = "bfloat16" in c["param_dtype"] or "float16" in c["param_dtype"]
    megatron = "megatron backend" in str(c.get("optimizer") or "")
    shape = TrainingShape(
        num_parameters=int(c["params"]),
        param_bytes=2 if half else 4,
        # megatron-core's DDP: fp32 grad buffer; its optimizer: fp32 main params + 2 fp32 moments
        grad_bytes=4 if megatron else (2 if "bfloat16" in c["param_dtype"] else 4),
        optimizer_bytes_per_param=12 if megatron and half else 2 * (2 if half else 4),
        num_layers=int(c["layers"]),
        hidden_size=int(c["hidden"]),
        num_attention_heads=int(c["heads"]),
        vocab_size=int(c["vocab"]),
        tensor_parallel=int(c.get("tensor_model_parallel_size", 1)),
    )
    budget = MemoryBudget(
        device_capacity_gib=139.8, micro_batch_size=int(c["train_batch"]), sequence_length=int(c["train_seq_len"])
    )
    est = estimate(shape, budget, buffer_size_gb=float(c["kv_buffer_gib"]), kv_cache_mode=kv_mode, capacity_gib=139.8)
    predicted = est.training_peak_gib + est.kv_during_training_gib  # what the allocator holds; margin is slack
    measured = float(mem["peak_allocated_gib"])
    return {
        "breakdown_gib": est.breakdown(),
        "predicted_peak_gib": predicted,
        "predicted_total_with_margin_gib": est.total_gib,
        "measured_peak_allocated_gib": measured,
        "measured_peak_reserved_gib": mem.get("peak_reserved_gib"),
        "error_pct": 100.0 * (predicted - measured) / measured,
        "config": c,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cuda-graph-decode")
    ap.add_argument("--resident", action="append", default=[], help="resident_vs_rebuild JSON (repeatable)")
    ap.add_argument("--inflight")
    ap.add_argument("--colocated-inprocess")
    ap.add_argument("--colocated-processes")
    ap.add_argument("--memory", action="append", default=[], help="memory_peak / colocated JSON (repeatable)")
    ap.add_argument("--park-probe")
    ap.add_argument("--reasoning", help="bench/inflight_handoff.py --workload reasoning JSON")
    ap.add_argument("--extra", action="append", default=[], help="NAME=PATH of another JSON to embed")
    ap.add_argument("--notes", default=None, help="JSON file: {figure: note} (what limits or qualifies each figure)")
    ap.add_argument("--date", default="2026-12-01")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)

    figures: dict[str, Any] = {k: None for k in TARGETS}
    missing: dict[str, str] = {}
    detail: dict[str, Any] = {}
    machine: dict[str, Any] = {}

    cgd = load(args.cuda_graph_decode)
    if cgd:
        machine = cgd.get("machine", machine)
        s = cgd.get("summary", {})
        flags = [s.get(f"{sc}_greedy_identical_{w}_training") for sc in ("layer", "block") for w in ("before", "after")]
        flags = [f for f in flags if f is not None]
        figures["graphs_same_greedy"] = bool(flags) and all(flags)
        figures["graphs_decode_speedup"] = s.get("block_speedup_b16")
        detail["cuda_graph_decode"] = s
    else:
        missing["graphs_same_greedy"] = missing["graphs_decode_speedup"] = "cuda_graph_decode did not run"

    res_rows = []
    for path in args.resident:
        d = load(path)
        if d:
            res_rows += d.get("table", [])
    detail["resident_vs_rebuild"] = res_rows
    for r in res_rows:
        if r.get("mode") == "persist" and r.get("graphs") == "on" and r.get("rebuild_over_resume"):
            figures["rebuild_over_resume_graphs"] = r["rebuild_over_resume"]
    if figures["rebuild_over_resume_graphs"] is None:
        missing["rebuild_over_resume_graphs"] = "no persist/graphs-on row in resident_vs_rebuild"

    inf = load(args.inflight)
    if inf:
        modes = inf.get("modes") or inf.get("results") or {}
        if isinstance(modes, list):
            modes = {m.get("mode"): m for m in modes}
        park, sync = modes.get("park", {}), modes.get("sync", {})
        if park.get("draining_share") is not None:
            figures["handoff_share_of_step"] = park["draining_share"]
        if park.get("samples_per_s") and sync.get("samples_per_s"):
            figures["park_over_sync"] = park["samples_per_s"] / sync["samples_per_s"]
        detail["inflight_handoff"] = {
            m: {k: v for k, v in row.items() if not isinstance(v, dict | list)} for m, row in modes.items()
        }
    for k in ("handoff_share_of_step", "park_over_sync"):
        if figures[k] is None:
            missing[k] = "bench/inflight_handoff.py --device cuda did not produce it"

    co = load(args.colocated_inprocess)
    if co and co.get("ratios"):
        r = {int(k): v for k, v in co["ratios"].items()}
        figures["colocated_over_dedicated_decode"] = r.get(16)
        detail["colocated_vs_dedicated_inprocess"] = {
            "ratios": r,
            "median_tokens_per_s": co.get("sections", {}).get("median_tokens_per_s"),
            "greedy_identical": co.get("greedy_identical_before_training_between_rounds"),
        }
    cp = load(args.colocated_processes)
    if cp:
        detail["colocated_vs_dedicated_two_processes"] = {"ratios": cp.get("ratios"), "scope": "layer"}
    if figures["colocated_over_dedicated_decode"] is None:
        missing["colocated_over_dedicated_decode"] = "no in-process colocated/dedicated run"

    mems = []
    for path in args.memory:
        d = load(path)
        if not d:
            continue
        mem = d.get("sections", {}).get("memory") or d.get("parts", {}).get("colocated", {}).get("sections", {}).get(
            "memory"
        )
        if not mem:
            continue
        try:
            pred = memory_prediction(mem)
        except Exception as exc:  # the estimator may not be on this branch yet
            pred = {"error": f"{type(exc).__name__}: {exc}", "config": mem.get("config")}
        pred["source"] = path
        mems.append(pred)
    detail["memory"] = mems
    graphless = [m for m in mems if "error_pct" in m and not m["config"].get("num_cuda_graphs")]
    if graphless:
        figures["memory_budget_error_pct"] = graphless[0]["error_pct"]
    elif mems and "error_pct" in mems[0]:
        figures["memory_budget_error_pct"] = mems[0]["error_pct"]
    else:
        missing["memory_budget_error_pct"] = "no memory run with an estimate (colo_fsm.guards.memory missing?)"

    rs = load(args.reasoning)
    for fig, key in REASONING_KEYS.items():
        if rs and rs.get(key) is not None:
            figures[fig] = rs[key]
        else:
            missing[fig] = "no reasoning run" if not rs else f"{key} absent (mode skipped or cut?)"
    if rs:
        detail["inflight_handoff_reasoning"] = {
            "modes": rs.get("modes"),
            "graph_decode_tokens_per_s": rs.get("graph_decode_tokens_per_s"),
            "shape": rs.get("shape"),
            "command": rs.get("command"),
        }

    pp = load(args.park_probe)
    if pp:
        detail["park_probe"] = {
            k: {kk: vv for kk, vv in v.items() if kk not in ("lengths",)} for k, v in pp.get("sections", {}).items()
        }
    for item in args.extra:
        name, _, path = item.partition("=")
        d = load(path)
        if d is not None:
            detail[name] = d

    out = {
        "machine": machine.get("gpu", "NVIDIA H200") + " (1 GPU, lent nvidia-h200)",
        "machine_detail": machine,
        "date": args.date,
        "commit": args.commit,
        "command": "bash scripts/gpu_bench_batch1.sh; bash scripts/gpu_bench_batch2.sh (see docs/gpu-runs/README.md)",
        "figures": figures,
        "targets": {k: f"{op} {t}" for k, (op, t) in TARGETS.items()},
        "met": {k: met(k, v) for k, v in figures.items()},
        "missing": missing,
        "notes": (load(args.notes) or {}) if args.notes else {},
        "detail": detail,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    for k, v in figures.items():
        print(f"{k:34s} {v!s:>24s}  target {TARGETS[k][0]} {TARGETS[k][1]}  met={met(k, v)}")
    for k, why in missing.items():
        print(f"missing {k}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
