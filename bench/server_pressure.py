"""The worst legal HTTP requests against the training run, and fairness to small requests under a stream of n=64.

Runs ``colo-fsm demo --serve`` on the CPU (one rank) and, in the same run, interleaves phases of ``--phase-s``
seconds (the order rotates each round; a phase's ratio is the median of its rounds' own ratios to the same round's
baseline, so a busy machine's load drift cancels):

* ``baseline``: no HTTP pressure;
* ``prefill``: one client re-sends the largest legal request made of prompts that nearly fill the context,
  ``max_tokens=1`` (the request that once starved training, now sized to ``max_request_tokens``);
* ``decode``: one client re-sends the largest legal request of long decodes (``n`` up to 64, ``max_tokens`` up to
  the context);
* ``n64``: one client re-sends the largest legal ``n=64`` request;
* ``hogs``: ``--hog-clients`` clients re-send that ``n=64`` request back to back: a stream of them, which keeps
  the server's token budget full.

A probe thread sends an unrelated 3-token request (``"12>"``, ``max_tokens=3``) every ``--probe-s`` seconds the
whole time. For each phase kind: training steps/s (from the run's ``metrics.jsonl`` wall times), the ratio to the
baseline phases, and the probe's latency (median, p95, max). The bars: every single-request phase keeps training at
0.75x or more of the baseline; the probe's median latency under ``hogs`` is at most 1 s. The request that used to
pass the old bound (32,768 prompts x 30 tokens, ``max_tokens=1``) is sent once and must be refused (400).

Usage::

    python bench/server_pressure.py                  # 4 rounds x 5 phases x 8 s (~3 min)
    python bench/server_pressure.py --quick          # 2 rounds x 5 phases x 5 s

Writes ``bench/results/server_pressure.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository, for bench.* and colo_fsm
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._demo import CONTEXT, Demo, machine, steps_in  # noqa: E402
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from bench._stats import median, pct  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "server_pressure.json"
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "worst single request: steps/s over baseline": "min_ratio",
    "baseline steps/s": "rows.0.steps_per_s",
}
PROBE = {"prompt": "12>", "max_tokens": 3}  # a 3-token request
RATIO_BAR = 0.75
PROBE_BAR_S = 1.0


def worst_cases(limit: int) -> dict[str, dict[str, Any]]:
    """The largest legal requests under ``limit`` tokens: many long prompts, many long decodes, ``n=64``."""
    plen = CONTEXT - 2  # 29 digits + ">" : 30 tokens, max_tokens=1 fits the 32-token context
    prompt = "1" * (plen - 1) + ">"
    count = max(1, limit // (plen + 1))
    decode_tokens = CONTEXT - 4
    n = max(1, min(64, limit // (4 + decode_tokens)))
    n64_tokens = max(1, min(CONTEXT - 4, limit // 64 - 4))
    return {
        "prefill": {"prompt": [prompt] * count, "max_tokens": 1, "temperature": 1.0},
        "decode": {"prompt": "123>", "n": n, "max_tokens": decode_tokens, "temperature": 1.0},
        "n64": {"prompt": "123>", "n": 64, "max_tokens": n64_tokens, "temperature": 1.0},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--probe-s", type=float, default=0.25)
    ap.add_argument("--hog-clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 5 s phases")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    if args.quick:
        args.rounds, args.phase_s = 2, 5.0
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="server-pressure-"))
    demo = Demo(tmp / "run", args.threads)
    load_start = machine()["load_avg"]
    phases: list[tuple[str, float, float]] = []
    probes: list[tuple[float, float, int]] = []  # (sent at, latency s, status)
    pressure: list[tuple[str, float, int]] = []  # (kind, latency s, status)
    stop = threading.Event()
    current: dict[str, str | None] = {"kind": None}
    try:
        url = demo.url()
        root = url.removesuffix("/v1")
        health = httpx.get(root + "/health", timeout=60).json()
        limit = int(health["max_request_tokens"])
        cases = worst_cases(limit)
        old = {"prompt": ["1" * 29 + ">"] * 32768, "max_tokens": 1}
        refused = httpx.post(url + "/completions", json=old, timeout=120)
        old_result = {"status": refused.status_code, "error": refused.json().get("error")}
        print(f"the 32,768 x 30-token request: {refused.status_code} {old_result['error']}", flush=True)
        if refused.status_code != 400:
            raise RuntimeError(f"the old worst-case request was not refused: {refused.status_code}")
        demo.warm_up()

        def probe() -> None:
            with httpx.Client(timeout=600) as h:
                while not stop.is_set():
                    t0 = time.time()
                    r = h.post(url + "/completions", json=PROBE)
                    probes.append((t0, time.time() - t0, r.status_code))
                    stop.wait(args.probe_s)

        def press(client: int) -> None:
            with httpx.Client(timeout=600) as h:
                while not stop.is_set():
                    kind = current["kind"]
                    if kind is None or (kind != "hogs" and client > 0):
                        time.sleep(0.02)
                        continue
                    t0 = time.time()
                    r = h.post(url + "/completions", json=cases["n64" if kind == "hogs" else kind])
                    pressure.append((kind, time.time() - t0, r.status_code))

        threads = [threading.Thread(target=probe, daemon=True)]
        threads += [threading.Thread(target=press, args=(i,), daemon=True) for i in range(args.hog_clients)]
        for t in threads:
            t.start()
        order = ["baseline", "prefill", "decode", "n64", "hogs"]
        for r in range(args.rounds):
            for kind in order[r % len(order) :] + order[: r % len(order)]:  # rotate the order each round
                current["kind"] = None if kind == "baseline" else kind
                t0 = time.time()
                time.sleep(args.phase_s)
                phases.append((kind, t0, time.time()))
                print(f"round {r} {kind}: {len([s for s in demo.step_times() if t0 <= s])} steps", flush=True)
        current["kind"] = None
        stop.set()
        for t in threads:
            t.join(600)
        steps = demo.step_times()
    finally:
        stop.set()
        rc = demo.stop()
    rows: list[dict[str, Any]] = []
    for kind in ("baseline", "prefill", "decode", "n64", "hogs"):
        spans = [(a, b) for k, a, b in phases if k == kind]
        n_steps, dur = steps_in(steps, spans)
        lat = [lt for t0, lt, code in probes if any(a <= t0 < b for a, b in spans) and code == 200]
        rows.append(
            {
                "phase": kind,
                "seconds": round(dur, 2),
                "steps": n_steps,
                "steps_per_s": n_steps / dur if dur else float("nan"),
                "probe_requests": len(lat),
                "probe_refused": sum(1 for t0, _, c in probes if any(a <= t0 < b for a, b in spans) and c != 200),
                "probe_latency_median_s": median(lat),
                "probe_latency_p95_s": pct(lat, 95),
                "probe_latency_max_s": max(lat) if lat else float("nan"),
                "pressure_requests": sum(1 for k, _, c in pressure if k == kind and c == 200),
                "pressure_refused": sum(1 for k, _, c in pressure if k == kind and c != 200),
                "request": _shape(cases["n64" if kind == "hogs" else kind]) if kind != "baseline" else None,
            }
        )
    base = rows[0]["steps_per_s"]
    for row in rows:
        row["pooled_ratio"] = row["steps_per_s"] / base if base else float("nan")
        per_round = []  # each round's phase over the same round's baseline: load drift between rounds cancels
        for r in range(args.rounds):
            mine = [(a, b) for k, a, b in phases[r * 5 : r * 5 + 5] if k == row["phase"]]
            quiet = [(a, b) for k, a, b in phases[r * 5 : r * 5 + 5] if k == "baseline"]
            (n1, s1), (n0, s0) = steps_in(steps, mine), steps_in(steps, quiet)
            per_round.append((n1 / s1) / (n0 / s0) if n0 and s0 and s1 else float("nan"))
        row["ratio_per_round"] = per_round
        row["ratio_vs_baseline"] = median(per_round)
    single = [r for r in rows if r["phase"] in ("prefill", "decode", "n64")]
    hogs = rows[-1]
    bars = {
        "worst_single_request_ratio": min(r["ratio_vs_baseline"] for r in single),
        "ratio_bar": RATIO_BAR,
        "small_request_p50_under_n64_stream_s": hogs["probe_latency_median_s"],
        "small_request_bar_s": PROBE_BAR_S,
    }
    bars["met"] = bool(
        bars["worst_single_request_ratio"] >= RATIO_BAR and hogs["probe_latency_median_s"] <= PROBE_BAR_S
    )
    print(f"\nmax_request_tokens={limit}; demo exit code {rc}")
    print(
        f"{'phase':10s} {'steps/s':>8s} {'ratio':>6s} {'probe p50 s':>11s} {'p95 s':>7s} {'max s':>7s} {'big reqs':>8s}"
    )
    for row in rows:
        print(
            f"{row['phase']:10s} {row['steps_per_s']:8.2f} {row['ratio_vs_baseline']:6.2f} "
            f"{row['probe_latency_median_s']:11.3f} {row['probe_latency_p95_s']:7.3f} "
            f"{row['probe_latency_max_s']:7.3f} {row['pressure_requests']:8d}"
        )
    out = {
        "provenance": prov,
        "bench": "server_pressure",
        "machine": machine(),
        "load_avg_start": load_start,
        "rounds": args.rounds,
        "phase_s": args.phase_s,
        "hog_clients": args.hog_clients,
        "max_request_tokens": limit,
        "max_inflight_tokens": int(health["tokens"]["max_inflight_tokens"]),
        "old_worst_case_request": old_result,
        "rows": rows,
        "min_ratio": bars["worst_single_request_ratio"],
        "bars": bars,
        "demo_exit_code": rc,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"worst single request: {bars['worst_single_request_ratio']:.2f}x training (bar {RATIO_BAR}); "
        f"3-token request p50 under a stream of n=64: {hogs['probe_latency_median_s']:.3f} s (bar {PROBE_BAR_S} s); "
        f"load average {out['machine']['load_avg'][0]:.1f}; wrote {args.out}"
    )
    if rc not in (0, 143):
        print(f"the demo exited with {rc}", file=sys.stderr)
        return 1
    return 0


def _shape(req: dict[str, Any]) -> dict[str, Any]:
    return {k: (len(v) if k == "prompt" and isinstance(v, list) else v) for k, v in req.items()}


if __name__ == "__main__":
    sys.exit(main())
