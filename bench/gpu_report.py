"""``python -m bench.gpu report``: the GPU performance page, regenerated from committed JSON (runs on the CPU).

    python -m bench.gpu report docs/gpu-runs --out docs/gpu-runs/PERFORMANCE.md --plot docs/gpu-runs/where-parking-pays.png

Reads every ``*inflight_handoff_reasoning_*.json`` (``bench/inflight_handoff.py``) and ``*engine_paths_*.json``
(``bench/engine_paths.py``) in the folder and writes one Markdown page: per workload (model, output-length cut,
``max_age``), each mode's samples/s with its measured steps and spread, the ratios the JSON gives (only between
modes with 3 or more measured steps; otherwise the JSON's reason), and where one mode was measured in several
runs (separate JSON files of the same workload, e.g. park beside drain in one process and beside sync in another),
every run's figure. ``--plot`` draws the same map as a picture. Nothing is computed that the JSON does not hold
but medians and ranges of its own numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

MODES = ("park", "drain", "sync", "abort")


def load(
    folder: Path, *, include_cpu: bool = False
) -> tuple[dict[tuple[str, int, int], list[dict[str, Any]]], list[tuple[Path, dict[str, Any]]]]:
    """Handoff runs grouped by workload ``(model, cut, max_age)``, and the engine-path runs."""
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("*inflight_handoff_reasoning_*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if "modes" not in data or (data.get("machine", {}).get("device", "cpu") == "cpu" and not include_cpu):
            continue
        shape = data["shape"]
        data["_file"] = path.name
        runs[(data["model"], int(shape["max_tokens"]), int(shape["max_trajectory_age_steps"]))].append(data)
    paths = [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(folder.glob("*engine_paths_*.json"))]
    return dict(runs), paths


def _fmt(x: Any, spec: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else spec.format(x)


def mode_row(name: str, rows: list[tuple[str, dict[str, Any]]]) -> str:
    """One table row for mode ``name`` over the runs that measured it (``(file, row)`` pairs)."""
    rates = [r["samples_per_s"] for _, r in rows]
    steps = [r["measured_steps"] for _, r in rows]
    step_spread = [r.get("step_samples_per_s") or {} for _, r in rows]
    lo = min(s.get("min", float("nan")) for s in step_spread)
    hi = max(s.get("max", float("nan")) for s in step_spread)
    runs = " / ".join(_fmt(x) for x in rates)
    first = rows[0][1]
    stats = first.get("inflight_stats") or {}
    abort = (
        f"{stats.get('ended', 0)} ended, {stats.get('discarded_tokens', 0):,} KV tokens re-prefilled" if stats else ""
    )
    return (
        f"| {name} | {_fmt(statistics.median(rates))} | {runs} | {_fmt(lo)}-{_fmt(hi)} | "
        f"{' + '.join(str(s) for s in steps)} | {_fmt(first.get('draining_share'), '{:.3f}')} | "
        f"{_fmt(first.get('handoff_p50_ms'), '{:.0f} ms')} | {_fmt(first.get('engine_decode_tokens_per_s'), '{:,.0f}')} | "
        f"{_fmt(first.get('mean_running_requests'), '{:.0f}')} | {abort} |"
    )


def workload_section(key: tuple[str, int, int], runs: list[dict[str, Any]]) -> list[str]:
    """The Markdown of one workload: the modes, then every ratio each run gives (or why it gives none)."""
    model, cut, age = key
    lines = [f"### {model}, output lengths cut at {cut:,}, max_age {age}", ""]
    for d in runs:
        lines.append(
            f"* `{d['_file']}`: commit `{d.get('commit') or '?'}`, {d.get('date', '?')}, `{d.get('command', '?')}`"
        )
    lines += [
        "",
        "| mode | samples/s (median of runs) | each run | single steps | measured steps | Draining share | "
        "handoff p50 | engine decode tok/s | mean running | abort cost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_mode: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for d in runs:
        for m, r in d["modes"].items():
            if "samples_per_s" in r:
                by_mode[m].append((d["_file"], r))
    for m in MODES:
        if m in by_mode:
            lines.append(mode_row(m, by_mode[m]))
    lines.append("")
    for d in runs:
        ratios = [
            f"{k[6:]} **{v:.2f}**"
            for k, v in d.items()
            if k.startswith("ratio_") and not k.endswith(("_cpu", "_per_round")) and isinstance(v, float)
        ]
        missing = [f"no {k}: {why}" for k, why in (d.get("no_ratio") or {}).items()]
        lines.append(f"* `{d['_file']}`: {'; '.join(ratios + missing) or 'no ratio'}")
    lines.append("")
    return lines


def engine_paths_section(paths: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Coordinator against direct, per mode, as the engine-path JSON gives it."""
    if not paths:
        return []
    lines = ["### The two engine paths (colo-fsm's direct batcher, megatron-core's coordinator loop)", ""]
    for path, d in paths:
        lines.append(f"* `{path.name}`: `{d.get('command', '?')}`")
        for m, r in (d.get("compare") or {}).items():
            lines.append(
                f"  * {m}: coordinator {r['coordinator_samples_per_s']:.2f} vs direct {r['direct_samples_per_s']:.2f} "
                f"samples/s (**{r['ratio_samples_per_s']:.2f}x**, {r['coordinator_measured_steps']} and "
                f"{r['direct_measured_steps']} measured steps); wall ms per engine step "
                f"{r['coordinator_step_wall_ms']:.1f} vs {r['direct_step_wall_ms']:.1f}"
            )
        for m, why in (d.get("no_ratio") or {}).items():
            lines.append(f"  * {m}: no ratio ({why})")
        for engine, err in (d.get("errors") or {}).items():
            lines.append(f"  * {engine}: failed ({err})")
    return [*lines, ""]


def plot(runs: dict[tuple[str, int, int], list[dict[str, Any]]], path: Path) -> None:
    """Grouped bars: samples/s of each mode per workload, a whisker over its runs and single steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(runs)
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(keys)), 4))
    width = 0.2
    for i, m in enumerate(MODES):
        xs, ys, lo, hi = [], [], [], []
        for j, key in enumerate(keys):
            rows = [d["modes"][m] for d in runs[key] if "samples_per_s" in d["modes"].get(m, {})]
            if not rows:
                continue
            rate = statistics.median(r["samples_per_s"] for r in rows)
            spread = [s for r in rows for s in (r.get("step_samples_per_s") or {}).values() if isinstance(s, float)]
            xs.append(j + (i - 1.5) * width)
            ys.append(rate)
            lo.append(rate - min([rate, *spread]))
            hi.append(max([rate, *spread]) - rate)
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=m)
    ax.set_xticks(range(len(keys)), [f"{m}\ncut {c:,}, age {a}" for m, c, a in keys])
    ax.set_ylabel("trained samples / s (made in the measured window)")
    ax.set_title("Where parking pays (one H200; whiskers: single steps)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


HEADER = """## Performance on one H200

Generated by `python -m bench.gpu report docs/gpu-runs` from the JSON committed beside this page; every figure
below is a number in that JSON. Each comes from a stage of `python -m bench.gpu` (see `README.md` here for the
stage of each file). Rules (`bench/inflight_handoff.py`): one engine per process, shared by every mode; each
mode runs 3 or more measured steps after its warm-up; samples/s counts the samples made inside the measured
window; a ratio is given only between modes that each have 3 or more measured steps, and otherwise the JSON
says why there is none. "Each run" lists the figure of every process that measured the mode (the spread between
two runs of the same seed); "single steps" is the range over its measured steps.
"""


def main(argv: list[str] | None = None) -> int:
    """Write the page (and the picture) from the folder's JSON."""
    ap = argparse.ArgumentParser(prog="python -m bench.gpu report", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="where the JSON is (e.g. docs/gpu-runs)")
    ap.add_argument("--out", type=Path, default=None, help="the Markdown page (default: print it)")
    ap.add_argument("--plot", type=Path, default=None, help="the picture of the same map (PNG)")
    ap.add_argument("--notes", type=Path, default=None, help="Markdown appended after the tables (by hand)")
    ap.add_argument("--include-cpu", action="store_true", help="also CPU runs (the smoke twins: to test this page)")
    args = ap.parse_args(argv)
    runs, paths = load(args.folder, include_cpu=args.include_cpu)
    lines = [HEADER]
    if args.plot is not None and runs:
        plot(runs, args.plot)
        lines += [f"![where parking pays]({args.plot.name})", ""]
    for key in sorted(runs):
        lines += workload_section(key, runs[key])
    lines += engine_paths_section(paths)
    if args.notes is not None and args.notes.exists():
        lines += [args.notes.read_text(encoding="utf-8").rstrip(), ""]
    text = "\n".join(lines).rstrip() + "\n"
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out} ({len(runs)} workload(s), {len(paths)} engine-path run(s))")
    return 0


__all__ = ["load", "main", "plot"]
