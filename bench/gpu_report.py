"""``python -m bench.gpu report``: the GPU performance page, regenerated from committed JSON (runs on the CPU).

    python -m bench.gpu report docs/gpu-runs --out docs/gpu-runs/PERFORMANCE.md \\
        --plot docs/gpu-runs/where-parking-pays.png --notes docs/gpu-runs/PERFORMANCE.notes.md

Reads, whatever their file names, every JSON in the folder that ``bench/inflight_handoff.py`` wrote
(``"benchmark": "inflight_handoff"``, direct engine), ``bench/engine_paths.py``'s and ``bench/engine_loop.py``'s
JSON, and the JUnit XML of the ``tests`` stage (``pytest -m gpu``). The headline is the runs of the newest commit
(the commit of the most recent run, by the date in its JSON); runs of older commits follow as history, with their
date and commit, and never enter a headline figure. Per workload (model, output-length cut, ``max_age``): each
mode's samples/s as the median of the runs that measured it with 3 or more measured steps, every run's figure
with its measured steps (a run with fewer is shown and left out of the median), and the range over single steps;
then every run's own row; then the ratios each JSON gives (it gives them only between modes with 3 or more
measured steps, and otherwise says why: ``no_ratio``). A ratio of an older JSON between modes with fewer steps
(computed before that rule) is shown as what it is, not as a ratio. ``--plot`` draws the headline as a picture.
Nothing is computed that the JSON does not hold but medians and ranges of its own numbers.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench._handoff import graph_mix, mode_of_ratio  # the bench's own rules
from bench._model_costs import Baseline, Timing
from bench._stats import cell as _fmt
from bench.gpu_plots import plot_bars, plot_map
from bench.gpu_runs import (
    MODES,
    Key,
    between_steps_ms,
    by_variant,
    commits_arg,
    in_median,
    label,
    load,
    measured,
    min_steps,
    mode_figures,
    mode_label,
    mode_variant,
    read_json,
    requests_per_step,
    split_history,
    unsteady,
)
from bench.park_ceiling import section as ceiling_section
from bench.parking_map import map_section


def steps_text(d: dict[str, Any], row: dict[str, Any]) -> str:
    """``3``; ``1 of 3, the run ended first`` when the process stopped before the mode's last measured step;
    ``..., cut by --mode-budget-s`` when the mode's budget stopped it. (JSON written before ``--steps`` counted
    measured steps only has no ``min_steps_for_a_ratio``: its planned steps included the warm-up.)"""
    n = int(row["measured_steps"])
    budget = ", cut by --mode-budget-s" if row.get("cut_by_budget") else ""
    if "min_steps_for_a_ratio" not in d:
        return f"{n}{budget}"
    planned = int(d["shape"].get("steps") or 0)
    if planned and n < planned:
        ended = int(d.get("rounds_done", d.get("rounds", 1)) or 0) < int(d.get("rounds", 1) or 1)
        return f"{n} of {planned}{budget or (', the run ended first' if ended else '')}"
    return f"{n}{budget}"


def mode_row(name: str, rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """One summary row for mode ``name`` over the runs that measured it (``(run, row)`` pairs, oldest first)."""
    figures = mode_figures(rows)
    each = []
    for d, r in rows:
        short = (
            ""
            if in_median(d, r)
            else "; not in the median"
            if r["measured_steps"] < min_steps(d)
            else "; not steady: not in the median"
            if unsteady(r)
            else "; made no sample: not in the median"
        )
        each.append(f"{_fmt(r['samples_per_s'])} ({steps_text(d, r)}{short})")
    lo, hi = figures.low, figures.high
    return (
        f"| {name} | {_fmt(figures.median)} | {'; '.join(each)} | {figures.steps} | "
        f"{_fmt(lo)}-{_fmt(hi) if hi is not None else '-'} |"
    )


def run_row(d: dict[str, Any], name: str, r: dict[str, Any]) -> str:
    """One mode of one run, every figure the JSON holds for it."""
    s = r.get("step_samples_per_s") or {}
    stats = r.get("inflight_stats") or {}
    abort = (
        f"{stats.get('ended', 0)} ended, {stats.get('reprefill_tokens', stats.get('discarded_tokens', 0)):,} tokens "
        "re-prefilled"
        if stats.get("ended")
        else "-"
    )
    made = f"{r['fresh_samples']:,} / {r['trained_samples']:,}" if "fresh_samples" in r else "-"
    single = f"{_fmt(s['median'])} ({_fmt(s['min'])}-{_fmt(s['max'])})" if s else "-"
    # recorded since the runs after 4366d6d; older runs (and sync, which has no collector) show "-"
    held = ", ".join(str(n) for n in r.get("groups_in_flight_at_handoff") or []) or "-"
    return (
        f"| `{d['_file']}` | {name} | {_fmt(r['samples_per_s'])} | {_fmt(r.get('trained_samples_per_s'))} | {made} | "
        f"{steps_text(d, r)} | {single} | "
        f"{_fmt(r.get('draining_share'), '{:.3f}')} | {_fmt(r.get('handoff_p50_ms'), '{:,.0f} ms')} | "
        f"{held} | {_fmt(r.get('engine_decode_tokens_per_s'), '{:,.0f}')} | {_fmt(r.get('mean_running_requests'), '{:.0f}')} | "
        f"{_fmt(r.get('peak_allocated_gib'), '{:.1f}')} | {abort} |"
    )


def ratio_lines(d: dict[str, Any]) -> str:
    """The ratios one JSON gives, and why it gives none where it gives none."""
    parts = []
    for k, v in d.items():
        if not k.startswith("ratio_") or k.endswith(("_cpu", "_per_round")) or not isinstance(v, float):
            continue
        name = k[len("ratio_") :]
        if name.startswith("park_over_"):
            other = mode_of_ratio(name)
            short = [
                f"{m} has {r['measured_steps']}"
                for m in ("park", other)
                if (r := measured(d, m)) is not None and r["measured_steps"] < min_steps(d)
            ]
            if short:
                parts.append(
                    f"{name} {v:.2f} as this JSON computed it ({', '.join(short)} measured step(s): below the "
                    f"{min_steps(d)}-step rule, not a ratio by it)"
                )
                continue
            filling = [f"{m} {why}" for m in ("park", other) if (r := measured(d, m)) and (why := unsteady(r))]
            if filling:
                parts.append(
                    f"{name} {v:.2f} as this JSON computed it ({'; '.join(filling)}: no steady state, not a ratio "
                    "by the rule the bench has applied since)"
                )
                continue
        park = measured(d, "park")
        if name.startswith("park_decode_over_graph_decode"):  # against the baseline's rows, or its matched ones
            suffix = name[len("park_decode_over_graph_decode") :]
            if park is not None and park["measured_steps"] < min_steps(d):
                parts.append(
                    f"{name} {v:.2f} as this JSON computed it (park has {park['measured_steps']} measured step(s): "
                    f"below the {min_steps(d)}-step rule)"
                )
                continue
            rate = d.get(f"graph_decode{suffix}_tokens_per_s")
            if rate:
                context = (
                    f" from the workload's mean decode context ({d['graph_decode'].get('matched_context_tokens', '?')}"
                    " tokens)"
                    if suffix
                    else ""
                )
                parts.append(
                    f"{name} **{v:.3f}** (park's engine decode against the pure CUDA-graph decode{context}, "
                    f"{rate:,.0f} tokens/s at batch {d.get(f'graph_decode{suffix}_batch', '?')})"
                )
                continue
        parts.append(f"{name} **{v:.3f}**")
    parts += [f"no {k}: {why}" for k, why in (d.get("no_ratio") or {}).items()]
    return f"* `{d['_file']}`: {'; '.join(parts) or 'no ratio'}"


def _commit(d: dict[str, Any]) -> str:
    return f"commit `{d['commit']}`" if d.get("commit") else "commit not recorded in the JSON"


def run_list(runs: list[dict[str, Any]]) -> list[str]:
    """Each run: file, commit, date, command."""
    return [
        f"* `{d['_file']}`: {_commit(d)}, {d.get('date', '?')}, "
        f"{d.get('machine', {}).get('device', '?')}, `{d.get('command', '?')}`"
        + (" (drain's race forced collector-first)" if mode_variant(d, "drain") == "forced" else "")
        + (
            " (sync's prompts aligned with the other modes' measured steps)"
            if mode_variant(d, "sync") == "aligned"
            else ""
        )
        for d in runs
    ]


RUN_HEADER = (
    "| run | mode | samples/s | trained samples/s | samples made / trained in the window | measured steps | "
    "single steps: median (min-max) | Draining share | handoff p50 | groups in flight at each handoff | "
    "engine decode tok/s | mean running | peak GiB | abort cost |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
)


def loop_cost_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The graph alone made like a loop's decode steps (``--graph-loop-costs``, ``rows_loop_costs``): each row beside
    the uniform rows' step at its batch from its own contexts' mean (linear between batches, and in the context
    between the baseline's two contexts), and what it adds."""
    lines: list[str] = []
    for d in runs:
        g = d["graph_decode"]
        rows = g.get("rows_loop_costs") or []
        if not rows:
            continue

        first, second = (tuple((int(r["batch"]), float(r["step_ms"])) for r in g.get(k) or [])
                         for k in ("rows", "rows_matched_context"))  # fmt: skip
        uniform = Baseline(int(g["context_tokens"]), first, g.get("matched_context_tokens"), second)
        lines += [
            f"The graph alone made like a loop's decode steps, from {g['loop_costs_context_tokens']:,} tokens "
            f"(`{d['_file']}`; `--graph-loop-costs`): ms per step, beside the uniform rows' step at that batch from "
            "the row's contexts' mean:",
            "",
            "| variant | batch | contexts (mean, longest) | ms per step | uniform rows | over them |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            if "step_ms" not in r:
                lines.append(f"| {r['variant']} | {r['batch']} | | {r.get('skipped') or r.get('error')} | | |")
                continue
            mean = r.get("contexts_mean", g["loop_costs_context_tokens"])
            ref = Timing(uniform.table_at(round(mean)), host_ms=0.0).step_s(int(r["batch"])) * 1000.0
            ctx = f"{r['contexts_mean']:,.0f}, {r['contexts_max']:,}" if "contexts_mean" in r else "uniform"
            lines.append(
                f"| {r['variant']} | {r['batch']} | {ctx} | {r['step_ms']:.2f} | {ref:.2f} | {r['step_ms'] / ref:.3f} |"
            )
        lines.append("")
    return lines


def decode_lines(runs: list[dict[str, Any]]) -> list[str]:
    """What a decode step costs, in each run: the pure CUDA-graph decode it measured (megatron-core's engine alone,
    at the baseline's context and, where it ran, at the workload's mean decode context and at each of its
    ``--graph-contexts``, a ``-`` where a batch did not fit the KV buffer there), and each mode's
    decode-only graph steps from its step profile. A comparison across two runs is the reader's to make: the
    page gives a ratio only inside one run."""
    lines: list[str] = []
    base = [d for d in runs if isinstance(d.get("graph_decode"), dict) and d["graph_decode"].get("rows")]
    if base:
        batches = sorted({int(r["batch"]) for d in base for r in d["graph_decode"]["rows"]})
        lines += [
            "Pure CUDA-graph decode (megatron-core's engine alone, the batch kept full): ms per step (tokens/s):",
            "",
            f"| run | context (tokens) | {' | '.join(f'batch {b}' for b in batches)} |",
            f"|---|---|{'---|' * len(batches)}",
        ]
        for d in base:
            g = d["graph_decode"]
            for rows, context in (
                (g["rows"], g.get("context_tokens")),
                (g.get("rows_matched_context") or [], g.get("matched_context_tokens")),
                *((c["rows"], c["context_tokens"]) for c in g.get("rows_by_context") or []),
            ):
                if not rows:
                    continue
                by = {int(r["batch"]): r for r in rows}
                cells = [
                    f"{by[b]['step_ms']:.2f} ({by[b]['decode_tokens_per_s']:,.0f})" if b in by else "-" for b in batches
                ]
                lines.append(f"| `{d['_file']}` | {_fmt(context, '{:,}')} | {' | '.join(cells)} |")
        lines.append("")
        failed = [(d, c) for d in base for c in d["graph_decode"].get("rows_by_context") or [] if c.get("error")]
        lines += [
            f"* `{d['_file']}`: from {c['context_tokens']:,} tokens: "
            + (c["error"] if c["error"].startswith("not run") else f"failed, {c['error']}")
            for d, c in failed
        ]
        lines += [""] if failed else []
        lines += loop_cost_lines(base)
    steps = [
        (d, m, prof)
        for d in runs
        for m in MODES
        if (r := measured(d, m)) is not None
        for prof in r.get("engine_step_profile_per_round") or []
        if isinstance(prof.get("decode_graph"), dict)
    ]
    if steps:
        lines += [
            "Each mode's decode-only CUDA-graph steps (its step profile, measured window), the requests running "
            "per engine step over every kind of step, and the ms between steps (Generating and Draining outside "
            "megatron's steps, per step: the engine loop's own work and any wait with nothing to run):",
            "",
            "| run | mode | steps | share of engine steps | ms per step | requests decoding | "
            "requests per engine step, all kinds | ms between steps |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for d, m, prof in steps:
            g = prof["decode_graph"]
            r = d["modes"][m]
            lines.append(
                f"| `{d['_file']}` | {m} | {g['steps']:,} | {g['share']:.3f} | {g['ms_per_step']:.2f} | "
                f"{g['mean_active']:.0f} | {_fmt(requests_per_step(prof), '{:.1f}')} | "
                f"{_fmt(between_steps_ms(r), '{:.2f}')} |"
            )
        lines.append("")
        lines += graph_lines(steps)
    return lines


def graph_lines(steps: list[tuple[dict[str, Any], str, dict[str, Any]]]) -> list[str]:
    """Which captured graph each mode's decode-only steps ran (where the profile counts them per graph),
    with the requests each graph's steps decoded: a step of 65 requests on the 128 graph pays for 128."""
    with_graphs = [(d, m, prof["decode_graph"]["graphs"]) for d, m, prof in steps if prof["decode_graph"].get("graphs")]
    if not with_graphs:
        return []
    lines = [
        "The same steps by the captured graph each ran (megatron pads a step to the smallest graph that holds "
        "it): share of the mode's decode-only graph steps, ms per step, requests decoded.",
        "",
        "| run | mode | graph: share, ms per step, requests decoded |",
        "|---|---|---|",
    ]
    lines += [f"| `{d['_file']}` | {m} | {graph_mix(graphs)} |" for d, m, graphs in with_graphs]
    return [*lines, ""]


def workload_section(key: Key, runs: list[dict[str, Any]]) -> list[str]:
    """The Markdown of one workload's headline: the modes over its runs, every run's rows, its ratios."""
    model, cut, age = key
    lines = [f"### {model}, output lengths cut at {cut:,}, max_age {age}", "", *run_list(runs), ""]
    lines += [
        "| mode | samples/s: median of runs | each run (measured steps) | measured steps in the median | "
        "single steps (min-max) |",
        "|---|---|---|---|---|",
    ]
    lines += [mode_row(label(*key), rows) for key, rows in by_variant(runs).items()]
    lines += ["", "Each run's rows:", "", *RUN_HEADER]
    lines += [run_row(d, mode_label(d, m), r) for d in runs for m in MODES if (r := measured(d, m)) is not None]
    lines += ["", "Ratios, as each JSON gives them:", "", *[ratio_lines(d) for d in runs], ""]
    return lines + decode_lines(runs)


def history_section(hist: dict[Key, list[dict[str, Any]]]) -> list[str]:
    """Older commits' runs: what they measured, labelled with their commit and date, outside every headline."""
    if not hist:
        return []
    lines = [
        "## History: runs of older commits",
        "",
        "Measured on older code (the commit and date of each are given) and not re-run on the headline commit. "
        "They are kept as a record; no figure above comes from them.",
        "",
    ]
    for key in sorted(hist):
        model, cut, age = key
        lines += [f"### {model}, output lengths cut at {cut:,}, max_age {age} (history)", ""]
        lines += [*run_list(hist[key]), "", *RUN_HEADER]
        lines += [run_row(d, m, r) for d in hist[key] for m in MODES if (r := measured(d, m)) is not None]
        failed = [f"{m}: {r.get('error')}" for d in hist[key] for m, r in d["modes"].items() if r.get("error")]
        lines += ["", *[ratio_lines(d) for d in hist[key]], *[f"* failed mode {f[:200]}" for f in failed], ""]
    return lines


def _paths_decode(mode: str, row: dict[str, Any], d: dict[str, Any]) -> str:
    """``; engine decode C vs D tokens/s`` (per second of Generating and Draining: the figure the graph baseline is
    compared with) from the comparison row, or from each engine's run (older JSON)."""
    rates = []
    for engine in ("coordinator", "direct"):
        rate = row.get(f"{engine}_engine_decode_tokens_per_s")
        if rate is None:
            run = ((d.get("runs") or {}).get(engine) or {}).get("modes") or {}
            rate = run.get(mode, {}).get("engine_decode_tokens_per_s")
        if rate is None:
            return ""
        rates.append(float(rate))
    return f"; engine decode {rates[0]:,.0f} vs {rates[1]:,.0f} tokens/s"


def engine_paths_section(paths: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Coordinator against direct, per mode, as the engine-path JSON gives it."""
    if not paths:
        return []
    lines = ["### The two engine paths (colo-fsm's direct batcher, megatron-core's coordinator loop)", ""]
    for path, d in paths:
        runs = [r for r in (d.get("runs") or {}).values() if isinstance(r, dict)]
        commit = d.get("commit") or next((r.get("commit") for r in runs if r.get("commit")), None) or "?"
        interval = ((d.get("runs") or {}).get("coordinator") or {}).get("ep_consensus_interval")
        checked = "" if interval is None else f"; the coordinator loop checked for a pause every {interval} step(s)"
        lines.append(f"* `{path.name}`: commit `{commit}`, `{d.get('command', '?')}`{checked}")
        for m, r in (d.get("compare") or {}).items():
            lines.append(
                f"  * {m}: coordinator {r['coordinator_samples_per_s']:.2f} vs direct {r['direct_samples_per_s']:.2f} "
                f"samples/s (**{r['ratio_samples_per_s']:.2f}x**, {r['coordinator_measured_steps']} and "
                f"{r['direct_measured_steps']} measured steps); wall ms per engine step "
                f"{r['coordinator_step_wall_ms']:.1f} vs {r['direct_step_wall_ms']:.1f}; handoff p50 "
                f"{r.get('coordinator_handoff_p50_ms', float('nan')):.1f} vs "
                f"{r.get('direct_handoff_p50_ms', float('nan')):.1f} ms" + _paths_decode(m, r, d)
            )
        for m, why in (d.get("no_ratio") or {}).items():
            lines.append(f"  * {m}: no ratio ({why})")
        for engine, err in (d.get("errors") or {}).items():
            lines.append(f"  * {engine}: failed ({err})")
    return [*lines, ""]


def engine_loop_section(folder: Path) -> list[str]:
    """``bench/engine_loop.py``'s JSON: the direct engine loop's own host cost per decode step (no model)."""
    lines: list[str] = []
    for path in sorted(folder.glob("*.json")):
        d = read_json(path)
        if not isinstance(d, dict) or d.get("bench") != "engine_loop":
            continue
        load_avg = d.get("machine", {}).get("loadavg_start") or [float("nan")]
        lines += [
            f"* `{path.name}` ({d.get('machine', {}).get('cpus', '?')} CPUs, load average {load_avg[0]:.1f}; "
            "median of interleaved rounds, range in brackets):",
            "",
            "| active requests | plain ms/step | watched ms/step |",
            "|---|---|---|",
        ]
        for r in d.get("rows", []):
            p, w = r.get("plain_range") or [None, None], r.get("watched_range") or [None, None]
            lines.append(
                f"| {r['active']} | {_fmt(r['plain_ms_per_step'], '{:.3f}')} ({_fmt(p[0], '{:.3f}')}-"
                f"{_fmt(p[1], '{:.3f}')}) | {_fmt(r['watched_ms_per_step'], '{:.3f}')} ({_fmt(w[0], '{:.3f}')}-"
                f"{_fmt(w[1], '{:.3f}')}) |"
            )
        lines.append("")
    if lines:
        lines[:0] = ["### The direct engine loop's own cost per decode step (stand-in backend, no model)", ""]
    return lines


def tests_section(folder: Path) -> list[str]:
    """The GPU tests (JUnit XML of ``pytest -m gpu``): counts and every test's outcome, newest run first."""
    suites = []
    for path in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            continue
        for suite in root.iter("testsuite"):
            suites.append((suite.get("timestamp") or "", path, suite))
    if not suites:
        return []
    lines = ["### GPU tests (`pytest -m gpu`)", ""]
    for i, (stamp, path, suite) in enumerate(sorted(suites, key=lambda s: s[0], reverse=True)):
        n, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        lines += [
            f"* `{path.name}` ({stamp or 'no date'}{', history' if i else ''}): **{n - failed - skipped} passed, "
            f"{failed} failed, {skipped} skipped** in {float(suite.get('time', 0)):.0f} s",
            "",
        ]
        if i:
            continue
        lines += ["| test | result |", "|---|---|"]
        for case in suite.iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = f"**{tag}**: {(el.get('message') or '').splitlines()[0][:160]}"
            module = (case.get("classname") or "").rsplit(".", 1)[-1]
            lines.append(f"| `{module}::{case.get('name')}` | {outcome} |")
        lines.append("")
    return lines


HEADER = """## Performance on one H200 (and, where a row names it, one H100)

Generated by `{command}` (`bench/gpu_report.py`) from the
files committed beside this page; every figure in the tables is a number in those files (the notes are written
by hand from them). Each file comes from a stage of
`python -m bench.gpu` (`README.md` here maps every file to its stage). Rules of the handoff bench
(`bench/inflight_handoff.py`): one engine per process, shared by every mode; each mode runs its measured steps
after its warm-up; samples/s counts the samples made inside the measured window per wall-clock second (trained
samples/s: what the measured steps trained); a ratio is given only between modes that each have 3 or more
measured steps in steady state (samples made within a fifth of samples trained: a window that made more was
filling its buffer), and otherwise the JSON, or this page for older JSON, says why there is none. "Each run" lists the figure of every process that
measured the mode (the spread between runs of the same seed); "single steps" is the range over measured steps.
A run on another card than the H200 is a workload of its own, named with its card, never pooled with the H200's.
"""


def main(argv: list[str] | None = None) -> int:
    """Write the page (and the picture) from the folder's files."""
    ap = argparse.ArgumentParser(prog="python -m bench.gpu report", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="where the JSON is (e.g. docs/gpu-runs)")
    ap.add_argument("--out", type=Path, default=None, help="the Markdown page (default: print it)")
    ap.add_argument(
        "--plot", type=Path, default=None, help="the picture of the headline (PNG); the map's goes beside it (-map.png)"
    )
    ap.add_argument("--notes", type=Path, default=None, help="Markdown placed after the headline tables (by hand)")
    ap.add_argument("--include-cpu", action="store_true", help="also CPU runs (the smoke twins: to test this page)")
    ap.add_argument(
        "--commits",
        default=None,
        help="comma-separated commits whose runs are the headline (they run the same measured code; the notes say "
        "why), or 'headline' for the committed page's (bench/gpu_runs.py: HEADLINE_COMMITS); default: the newest "
        "run's commit",
    )
    args = ap.parse_args(argv)
    runs, paths = load(args.folder, include_cpu=args.include_cpu)
    commits = commits_arg(args.commits)
    commit, head, hist = split_history(runs, commits)
    command = " ".join(["python -m bench.gpu report", *(argv if argv is not None else sys.argv[2:])])
    lines = [HEADER.format(command=command)]
    if head:
        dates = sorted(str(d.get("date") or "")[:10] for rs in head.values() for d in rs)
        devices = sorted({d.get("machine", {}).get("device", "?") for rs in head.values() for d in rs})
        lines += [
            f"## Headline: commit{'s' if len(commits) > 1 else ''} `{commit or '?'}`, {dates[-1]}, {', '.join(devices)}",
            "",
            (
                f"The runs of the commits named ({commit}; the notes say what each measured and what differs between them); every other "
                "run is under History at the end."
                if commits
                else "The runs of the newest commit in this folder; older commits' runs are under History at the end."
            ),
            "",
        ]
        if args.plot is not None:
            plot_bars(
                head,
                args.plot,
                title=f"Where parking pays (one {', '.join(devices)}, commit{'s' if len(commits) > 1 else ''} {commit or '?'})",
            )
            lines += [f"![where parking pays: samples/s per mode]({args.plot.name})", ""]
        every = [d for rs in head.values() for d in rs]
        picture = None
        if args.plot is not None:  # the map's own picture, beside the bars: <plot>-map.png
            picture = args.plot.with_name(f"{args.plot.stem}-map{args.plot.suffix}")
            plot_map(every, picture, title=f"Where parking pays: the map (commits {commit or '?'})")
        lines += map_section(every, picture.name if picture else None)
    for key in sorted(head):
        lines += workload_section(key, head[key])
    if head:
        lines += ceiling_section(args.folder, set(commits) if commits else {str(commit)})
    lines += engine_paths_section(paths)
    lines += engine_loop_section(args.folder)
    lines += tests_section(args.folder)
    if args.notes is not None and args.notes.exists():
        lines += [args.notes.read_text(encoding="utf-8").rstrip(), ""]
    lines += history_section(hist)
    text = "\n".join(lines).rstrip() + "\n"
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(
            f"wrote {args.out} (headline commit {commit}: {sum(map(len, head.values()))} run(s); "
            f"{sum(map(len, hist.values()))} older run(s); {len(paths)} engine-path run(s))"
        )
    return 0


__all__ = ["decode_lines", "engine_paths_section", "main", "ratio_lines", "workload_section"]
