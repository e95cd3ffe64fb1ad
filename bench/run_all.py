"""Run every benchmark in ``bench/``: each ``bench/*.py`` script that defines a top-level ``main()``.

Scripts are found by reading their source (nothing is imported here), run one after the other in their own
Python process (a benchmark may start Ray or touch a GPU), and summarized in a table. Extra arguments after
``--`` go to every script (e.g. ``-- --quick`` where the scripts support it).

Usage::

    python bench/run_all.py                   # every benchmark
    python bench/run_all.py --list            # what would run
    python bench/run_all.py --only transition_overhead -- --quick
    python bench/run_all.py --only inflight_handoff -- --quick   # park vs drain vs sync (< 3 min on 2 cores)
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


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
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per script (default 1800)")
    args = ap.parse_args(argv)

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
    for p in scripts:
        print(f"=== {p.stem} ===", flush=True)
        t0 = time.perf_counter()
        try:
            rc = subprocess.run([sys.executable, str(p), *extra], cwd=BENCH.parent, timeout=args.timeout).returncode
            status = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {args.timeout:g}s"
        rows.append((p.stem, status, time.perf_counter() - t0))
        print(flush=True)
    width = max((len(n) for n, _, _ in rows), default=10)
    print(f"{'benchmark':<{width}}  {'status':<20} {'seconds':>8}")
    for name, status, secs in rows:
        print(f"{name:<{width}}  {status:<20} {secs:>8.1f}")
    return 0 if all(s == "ok" for _, s, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
