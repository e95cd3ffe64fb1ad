"""The engine loop's own host cost per decode step: what colo-fsm adds to every engine step, without a model.

:class:`~colo_fsm.adapters.engine.ContinuousBatcher` over a stand-in backend whose step costs nothing (it returns
one token for every active request at once), with ``N`` requests active: what one loop iteration costs is then
all the loop's own work (admission, the step's token intake, version stamping, finish checks). Two request kinds,
interleaved round by round in one process: *plain* requests (the rollouts' case: nobody watches each token) and
*watched* ones (an ``on_token`` callback that does nothing: the per-token path streaming and the server take).
On a GPU this host time adds to every engine step of the direct path (the coordinator path runs megatron-core's
own loop instead).

    python bench/engine_loop.py            # 64 and 256 active, 5 rounds of 1.5 s per kind
    python bench/engine_loop.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from colo_fsm.adapters.batching import BackendRequest, ContinuousBatcher, StepOutput  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "engine_loop.json"
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "plain ms/step, 256 active": "plain_ms_per_step_256",
    "plain ms/step, 64 active": "plain_ms_per_step_64",
}


class FreeBackend:
    """A step backend whose step costs nothing: one token (id 5, log-prob -0.1) per active request."""

    name = "free"

    def __init__(self) -> None:
        self.rows: dict[int, BackendRequest] = {}

    def add(self, request: BackendRequest) -> None:
        self.rows[request.request_id] = request

    def step(self) -> list[StepOutput]:
        return [StepOutput(rid, (5,), (-0.1,)) for rid in self.rows]

    def abort(self, request_id: int) -> None:
        self.rows.pop(request_id, None)

    def suspend(self) -> float:
        return 0.0

    def resume(self) -> float:
        return 0.0

    def shutdown(self) -> None:
        self.rows.clear()


def ms_per_step(active: int, *, watched: bool, seconds: float) -> float:
    """Milliseconds per loop iteration with ``active`` requests decoding (their max_tokens far away)."""
    b = ContinuousBatcher(FreeBackend, max_active_requests=active)
    b.start()
    on_token = (lambda tok, lp, v: None) if watched else None
    handles = [b.submit([1, 2, 3], max_tokens=10**7, temperature=1.0, on_token=on_token) for _ in range(active)]
    deadline = time.monotonic() + 30
    while b.counts().running < active and time.monotonic() < deadline:
        time.sleep(0.01)
    s0, t0 = b.steps, time.perf_counter()
    time.sleep(seconds)
    n, dt = b.steps - s0, time.perf_counter() - t0
    for h in handles:
        h.cancel()
    b.shutdown()
    return 1e3 * dt / max(1, n)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the table, write ``bench/results/engine_loop.json``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 0.5 s per kind")
    p.add_argument("--active", type=int, nargs="+", default=[64, 256])
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    rounds, seconds = (2, 0.5) if args.quick else (5, 1.5)
    load = os.getloadavg()
    rows: list[dict[str, Any]] = []
    print(f"engine loop, own cost per decode step (stand-in backend), median of {rounds} interleaved rounds")
    print(f"{'active':>7} {'plain ms/step':>14} {'watched ms/step':>16} {'us/request plain':>17}")
    out: dict[str, Any] = {"bench": "engine_loop", "provenance": prov, "rows": rows}
    for n in args.active:
        plain, watched = [], []
        for _ in range(rounds):
            plain.append(ms_per_step(n, watched=False, seconds=seconds))
            watched.append(ms_per_step(n, watched=True, seconds=seconds))
        row = {
            "active": n,
            "plain_ms_per_step": statistics.median(plain),
            "plain_range": [min(plain), max(plain)],
            "watched_ms_per_step": statistics.median(watched),
            "watched_range": [min(watched), max(watched)],
        }
        rows.append(row)
        out[f"plain_ms_per_step_{n}"] = row["plain_ms_per_step"]
        print(
            f"{n:>7} {row['plain_ms_per_step']:>14.3f} {row['watched_ms_per_step']:>16.3f} "
            f"{1e3 * row['plain_ms_per_step'] / n:>17.2f}"
        )
    out["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_start": load,
        "loadavg_end": os.getloadavg(),
    }
    print(f"load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
