#!/usr/bin/env python
"""Mutation proof: apply each lifecycle bug, run every killer, print mutant -> killed-by; exit 1 if one survives.

.venv/bin/python scripts/mutation_proof.py [--json bench/results/mutation_proof.json] [--max-examples 600]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.support (the proof kit) lives in the repository, not the package
    sys.path.insert(0, str(ROOT))

from bench._handoff import JsonReport  # noqa: E402
from bench._provenance import provenance  # noqa: E402
from tests.support.mutants import (  # noqa: E402
    HYPOTHESIS_EXAMPLES,
    KILLERS,
    MUTANTS,
    SUITE_MUTANTS,
    evaluate,
    kill_by_suite_test,
    table,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=Path("bench/results/mutation_proof.json"))
    ap.add_argument(
        "--max-examples", type=int, default=HYPOTHESIS_EXAMPLES, help="hypothesis programs per mutant (stops at a kill)"
    )
    ap.add_argument("--only", action="append", help="run only these mutants")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each killer's evidence")
    ap.add_argument("--no-suite", action="store_true", help="skip the component mutants killed by default-suite tests")
    args = ap.parse_args(argv)
    logging.getLogger("colo_fsm").setLevel(logging.CRITICAL)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    prov = provenance()  # commit, date, machine, load at the start
    t0 = time.perf_counter()
    results = [evaluate(m, KILLERS, hypothesis_examples=args.max_examples) for m in chosen]
    print(table(results))
    suite: dict[str, str | None] = {}
    if not args.no_suite:
        print(f"\n{'suite mutant':<44} killed by (a default-suite test, by an assertion)")
        for name, m in SUITE_MUTANTS.items():
            if args.only and name not in args.only:
                continue
            suite[name] = assertion = kill_by_suite_test(name)
            print(f"{name:<44} {m.test.split('::')[-1] if assertion else 'SURVIVED ' + m.test}")
            if args.verbose and assertion:
                print(f"  {assertion[:300]}")
    survivors = [r.name for r in results if not r.killed] + [n for n, e in suite.items() if e is None]
    missing = {r.name: r.missing for r in results if r.missing}
    seconds = time.perf_counter() - t0
    print(
        f"\n{sum(r.killed for r in results)}/{len(results)} mutants killed in {seconds:.1f}s"
        + (f"; SURVIVED: {survivors}" if survivors else "")
        + (f"; expected killers that missed: {missing}" if missing else "")
    )
    if args.verbose:
        for r in results:
            print(f"\n{r.name} ({r.breaks})")
            for k, evidence in r.killed_by.items():
                print(f"  {k:<10} {evidence[:300]}")
    if args.json:
        JsonReport(
            args.json,
            {
                "provenance": prov,
                "seconds": round(seconds, 1),
                "loadavg_end": os.getloadavg(),
                "max_examples": args.max_examples,
                "only": args.only,  # None: every mutant
                "suite_mutants_run": not args.no_suite,
                "killed": sum(r.killed for r in results),
                "total": len(results),
                "suite_mutants": {n: {"test": SUITE_MUTANTS[n].test, "assertion": e} for n, e in suite.items()},
                "mutants": [
                    {
                        "name": r.name,
                        "breaks": r.breaks,
                        "killed_by": r.killed_by,
                        "survived_by": r.survived_by,
                        "expected": r.expected,
                        "seconds": r.seconds,
                    }
                    for r in results
                ],
            },
        ).write()
    return 1 if survivors or missing else 0


if __name__ == "__main__":
    sys.exit(main())
