"""Run every benchmark in ``bench/``: each ``bench/*.py`` script that defines a top-level ``main()``.

Scripts are found by reading their source (nothing is imported here), run one after the other in their own
Python process (a benchmark may start Ray or touch a GPU), and summarized in a table. Extra arguments after
``--`` go to every script (e.g. ``-- --quick`` where the scripts support it).

``--repeat N`` runs each script N times, keeps each run's JSON (``bench/results/repeat/<script>/run<i>/``) and
reports every figure as the median with its quartiles and range over the runs (one figure from one run is not
evidence on a shared machine): the figures a script declares as its ``HEADLINE`` (and any ``--figure``) in a
table, every number of its JSON in ``bench/results/repeat/<script>/spread.json``, with the load average before
and after each run.

Usage::

    python bench/run_all.py                   # every benchmark
    python bench/run_all.py --list            # what would run
    python bench/run_all.py --only transition_overhead -- --quick
    python bench/run_all.py --only inflight_handoff -- --quick   # park vs drain vs sync (< 3 min on 2 cores)
    python bench/run_all.py --repeat 5 --only fingerprint_barrier -- --quick
    python bench/run_all.py --repeat 3 --only inflight_handoff --figure ratio_park_over_drain -- --quick
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH.parent) not in sys.path:  # the repository, for bench.*
    sys.path.insert(0, str(BENCH.parent))
from bench._provenance import provenance  # noqa: E402
from bench._spread import declared_headline, headline_rows, read_runs, summarize  # noqa: E402

RESULTS = BENCH / "results"


def has_main(path: Path) -> bool:
    """Whether ``path`` defines a module-level ``def main(...)``."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError):
        return False
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "main" for n in tree.body)


NOT_BENCHMARKS = ("gpu.py", "gpu_report.py")  # the GPU stage runner (it runs the benchmarks) and its report


def discover(bench_dir: Path = BENCH) -> list[Path]:
    """Benchmark scripts in ``bench_dir``: ``*.py`` with a ``main()``, except this runner, the GPU stage runner and
    its report, and ``_private.py``."""
    return sorted(
        p
        for p in bench_dir.glob("*.py")
        if p.name != Path(__file__).name and p.name not in NOT_BENCHMARKS and not p.name.startswith("_") and has_main(p)
    )


def main(argv: list[str] | None = None) -> int:
    """Run the discovered benchmarks; returns 0 when every one exits 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description="Run every bench/*.py script that defines main().")
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this script (stem), repeatable")
    ap.add_argument("--list", action="store_true", help="list the scripts and exit")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per script run (default 1800)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="run each script N times; report the spread")
    ap.add_argument(
        "--figure",
        action="append",
        default=[],
        metavar="PATH",
        help="with --repeat: also report this figure of the JSON (dotted path, e.g. rows.0.ratio), repeatable",
    )
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("argument --repeat: must be >= 1")

    scripts = discover()
    if args.only:
        unknown = sorted(set(args.only) - {p.stem for p in scripts})
        if unknown:
            ap.error(
                f"argument --only: unknown benchmark(s) {', '.join(unknown)}; "
                f"expected one of {', '.join(p.stem for p in scripts)}"
            )
        scripts = [p for p in scripts if p.stem in args.only]
    if args.list:
        for p in scripts:
            print(p.stem)
        return 0

    rows: list[tuple[str, str, float]] = []
    spreads: list[tuple[str, str, str, str, str, str]] = []
    for p in scripts:
        folders: list[Path] = []
        for i in range(args.repeat):
            label = p.stem if args.repeat == 1 else f"{p.stem} (run {i + 1}/{args.repeat})"
            print(f"=== {label} ===", flush=True)
            status, secs, written, load = run_script(p, extra, args.timeout)
            rows.append((label, status, secs))
            if args.repeat > 1:
                folders.append(keep_run(p.stem, i + 1, written, load, status))
            print(flush=True)
        if args.repeat > 1:
            spreads += report_spread(p, folders, args.figure)
    width = max((len(n) for n, _, _ in rows), default=10)
    print(f"{'benchmark':<{width}}  {'status':<20} {'seconds':>8}")
    for name, status, secs in rows:
        print(f"{name:<{width}}  {status:<20} {secs:>8.1f}")
    if spreads:
        print(f"\nover {args.repeat} runs each (median, quartiles, range):")
        print("| benchmark | figure | median | quartiles | range | runs |")
        print("|---|---|---|---|---|---|")
        for row in spreads:
            print("| " + " | ".join(row) + " |")
    return 0 if all(s == "ok" for _, s, _ in rows) else 1


def run_script(script: Path, extra: list[str], timeout: float) -> tuple[str, float, list[Path], list[float]]:
    """Run one script once: its status, seconds, the JSON files it wrote under ``bench/results/`` and the 1-minute
    load average before and after."""
    load = [os.getloadavg()[0]]
    started = time.time_ns()
    t0 = time.perf_counter()
    try:
        rc = subprocess.run([sys.executable, str(script), *extra], cwd=BENCH.parent, timeout=timeout).returncode
        status = "ok" if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        status = f"timeout after {timeout:g}s"
    secs = time.perf_counter() - t0
    load.append(os.getloadavg()[0])
    written = sorted(f for f in RESULTS.glob("*.json") if f.stat().st_mtime_ns >= started)
    return status, secs, written, load


def keep_run(stem: str, i: int, written: list[Path], load: list[float], status: str) -> Path:
    """Copy one run's JSON files to ``bench/results/repeat/<stem>/run<i>/`` (with its load and status)."""
    folder = RESULTS / "repeat" / stem / f"run{i}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for f in written:
        shutil.copy2(f, folder / f.name)
    (folder / "run.meta").write_text(json.dumps({"status": status, "loadavg_1min_before_after": load}) + "\n")
    return folder


def report_spread(script: Path, folders: list[Path], figures: list[str]) -> list[tuple[str, str, str, str, str, str]]:
    """Write ``bench/results/repeat/<stem>/spread.json`` and return the table rows of the headline figures.

    Every run that wrote JSON counts, whatever its exit status (a benchmark that misses its target exits 1 and
    its figures are still what it measured); the status of each run is in its ``run.meta`` and here."""
    metas = [json.loads((f / "run.meta").read_text()) for f in folders]
    ok = [f for f in folders if any(f.glob("*.json"))]
    summary = summarize(read_runs(ok))
    loads = [m["loadavg_1min_before_after"] for m in metas]
    named = {**declared_headline(script), **{path: path for path in figures}}
    out = folders[0].parent / "spread.json" if folders else RESULTS / "repeat" / script.stem / "spread.json"
    out.write_text(
        json.dumps(
            {
                "script": script.stem,
                "provenance": provenance(),  # of the spread's writing; each run's own JSON holds its start
                "runs": len(folders),
                "runs_with_json": len(ok),
                "status": [m["status"] for m in metas],
                "loadavg_1min_before_after": loads,
                "figures": summary,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out} ({len(ok)}/{len(folders)} runs wrote JSON)")
    if not named:
        return [(script.stem, "(no HEADLINE declared; every figure in spread.json)", "-", "-", "-", str(len(ok)))]
    return headline_rows(script.stem, named, summary)


if __name__ == "__main__":
    sys.exit(main())
