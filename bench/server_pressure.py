"""One legal worst-case HTTP request against the training run: the CPU demo's step rate with and without it.

Runs ``colo-fsm demo --serve`` on the CPU (one rank) and, in the same run, interleaves phases of ``--phase-s``
seconds: ``baseline`` (no HTTP pressure), ``prefill`` (one client re-sends the largest legal request made of
prompts that nearly fill the context, ``max_tokens=1``: the request that once starved training, now sized to
``max_request_tokens``) and ``decode`` (one client re-sends ``n=64`` short prompts with ``max_tokens`` up to the
context, sized the same way). A probe thread sends an unrelated 4-token request every ``--probe-s`` seconds the
whole time. For each phase kind: training steps/s (from the run's ``metrics.jsonl`` wall times), the ratio to the
baseline phases, and the probe's latency (median, p95, max). The request that used to pass the old bound
(32,768 prompts x 30 tokens, ``max_tokens=1``) is sent once and must be refused (400).

Usage::

    python bench/server_pressure.py                  # 2 rounds x 3 phases x 8 s (~70 s)
    python bench/server_pressure.py --quick          # 1 round x 3 phases x 5 s

Writes ``bench/results/server_pressure.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "server_pressure.json"
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "prefill: steps/s over baseline": "rows.1.ratio_vs_baseline",
    "decode: steps/s over baseline": "rows.2.ratio_vs_baseline",
    "baseline steps/s": "rows.0.steps_per_s",
}
CONTEXT = 32  # the demo model's max_sequence_length


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (NaN for an empty list)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))]


def worst_cases(limit: int) -> dict[str, dict[str, Any]]:
    """The two largest legal requests under ``limit`` tokens: many long prompts, or many long decodes."""
    plen = CONTEXT - 2  # 29 digits + ">" : 30 tokens, max_tokens=1 fits the 32-token context
    prompt = "1" * (plen - 1) + ">"
    count = max(1, limit // (plen + 1))
    decode_tokens = CONTEXT - 4
    n = max(1, min(64, limit // (4 + decode_tokens)))
    return {
        "prefill": {"prompt": [prompt] * count, "max_tokens": 1, "temperature": 1.0},
        "decode": {"prompt": "123>", "n": n, "max_tokens": decode_tokens, "temperature": 1.0},
    }


class Demo:
    """The demo subprocess, serving."""

    def __init__(self, run_dir: Path, threads: int) -> None:
        args = ["--run-dir", str(run_dir), "--steps", "1000000", "--serve", "--no-tensorboard"]
        args += ["--validate-every", "1000000", "--checkpoint-every", "1000000", "--threads", str(threads)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
        self.err = (run_dir.parent / "stderr.txt").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "colo_fsm.demo", *args],
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.metrics = run_dir / "metrics.jsonl"

    def url(self, timeout: float = 180) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            if line.startswith("dp_openai_server_base_urls="):
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep the pipe drained
                return str(json.loads(line.split("=", 1)[1])[0])
            if time.monotonic() > deadline:
                break
        raise RuntimeError("the demo printed no base URL")

    def step_times(self) -> list[float]:
        if not self.metrics.is_file():
            return []
        out = []
        for line in self.metrics.read_text().splitlines():
            try:
                out.append(float(json.loads(line)["wall_time"]))
            except (ValueError, KeyError):
                continue  # a torn last line
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        return int(self.proc.returncode)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--probe-s", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="1 round of 5 s phases")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.phase_s = 1, 5.0
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="server-pressure-"))
    demo = Demo(tmp / "run", args.threads)
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
        while len(demo.step_times()) < 5:  # warm up: the run is training
            assert demo.proc.poll() is None, (tmp / "stderr.txt").read_text()[-2000:]
            time.sleep(0.2)

        def probe() -> None:
            with httpx.Client(timeout=600) as h:
                while not stop.is_set():
                    t0 = time.time()
                    r = h.post(url + "/completions", json={"prompt": "123>", "max_tokens": 4})
                    probes.append((t0, time.time() - t0, r.status_code))
                    stop.wait(args.probe_s)

        def press() -> None:
            with httpx.Client(timeout=600) as h:
                while not stop.is_set():
                    kind = current["kind"]
                    if kind is None:
                        time.sleep(0.02)
                        continue
                    t0 = time.time()
                    r = h.post(url + "/completions", json=cases[kind])
                    pressure.append((kind, time.time() - t0, r.status_code))

        threads = [threading.Thread(target=probe, daemon=True), threading.Thread(target=press, daemon=True)]
        for t in threads:
            t.start()
        order = ["baseline", "prefill", "decode"]
        for r in range(args.rounds):
            for kind in order[r % 3 :] + order[: r % 3]:  # rotate the order each round
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
    rows = []
    for kind in ("baseline", "prefill", "decode"):
        spans = [(a, b) for k, a, b in phases if k == kind]
        n_steps = sum(sum(1 for s in steps if a <= s < b) for a, b in spans)
        dur = sum(b - a for a, b in spans)
        lat = [lt for t0, lt, code in probes if any(a <= t0 < b for a, b in spans) and code == 200]
        rows.append(
            {
                "phase": kind,
                "seconds": round(dur, 2),
                "steps": n_steps,
                "steps_per_s": n_steps / dur if dur else float("nan"),
                "probe_requests": len(lat),
                "probe_latency_median_s": statistics.median(lat) if lat else float("nan"),
                "probe_latency_p95_s": pct(lat, 95),
                "probe_latency_max_s": max(lat) if lat else float("nan"),
                "pressure_requests": sum(1 for k, _, c in pressure if k == kind and c == 200),
                "pressure_refused": sum(1 for k, _, c in pressure if k == kind and c != 200),
                "request": {k: (len(v) if k == "prompt" and isinstance(v, list) else v) for k, v in cases[kind].items()}
                if kind in cases
                else None,
            }
        )
    base = rows[0]["steps_per_s"]
    for row in rows:
        row["ratio_vs_baseline"] = row["steps_per_s"] / base if base else float("nan")
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
        "bench": "server_pressure",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "load_avg": os.getloadavg(),
        "rounds": args.rounds,
        "phase_s": args.phase_s,
        "max_request_tokens": limit,
        "old_worst_case_request": old_result,
        "rows": rows,
        "min_ratio": min(r["ratio_vs_baseline"] for r in rows[1:]),
        "demo_exit_code": rc,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"min ratio (pressure / baseline): {out['min_ratio']:.2f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
