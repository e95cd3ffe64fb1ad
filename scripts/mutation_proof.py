#!/usr/bin/env python
"""Mutation proof: apply each lifecycle bug, run every killer, print mutant -> killed-by; exit 1 if one survives.

.venv/bin/python scripts/mutation_proof.py [--json bench/results/mutation_proof.json] [--max-examples 500]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.support (the proof kit) lives in the repository, not the package
    sys.path.insert(0, str(ROOT))

from tests.support.mutants import KILLERS, MUTANTS, evaluate, table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=Path("bench/results/mutation_proof.json"))
    ap.add_argument("--max-examples", type=int, default=500, help="hypothesis programs per mutant (stops at a kill)")
    ap.add_argument("--only", action="append", help="run only these mutants")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each killer's evidence")
    args = ap.parse_args(argv)
    logging.getLogger("colo_fsm").setLevel(logging.CRITICAL)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    t0 = time.perf_counter()
    results = [evaluate(m, KILLERS, hypothesis_examples=args.max_examples) for m in chosen]
    print(table(results))
    survivors = [r.name for r in results if not r.killed]
    missing = {r.name: r.missing for r in results if r.missing}
    print(
        f"\n{sum(r.killed for r in results)}/{len(results)} mutants killed in {time.perf_counter() - t0:.1f}s"
        + (f"; SURVIVED: {survivors}" if survivors else "")
        + (f"; expected killers that missed: {missing}" if missing else "")
    )
    if args.verbose:
        for r in results:
            print(f"\n{r.name} ({r.breaks})")
            for k, evidence in r.killed_by.items():
                print(f"  {k:<10} {evidence[:300]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "killed": sum(r.killed for r in results),
                    "total": len(results),
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
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 1 if survivors or missing else 0


if __name__ == "__main__":
    sys.exit(main())
