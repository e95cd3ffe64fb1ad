"""OpenAI-compatible server across a suspend: latency awake vs queued, and how many were served, queued or 503.

A :class:`~colo_fsm.server.GatedEngine` serves a fake engine whose generation takes ``--gen-ms`` per request,
on 127.0.0.1. ``--clients`` threads of the official ``openai`` client (``max_retries=0``) send completions in
a closed loop. For each suspend length X the engine is awake for a while, suspended for X ms (the gate
closes, in-flight requests finish, then the engine suspends), resumed, and awake again. Requests arriving
while suspended wait at the gate; those waiting longer than ``--request-timeout`` get 503 + Retry-After.

Usage::

    python bench/server_suspend.py            # X = 0 (no suspend), 100, 500, 2000 ms; timeout 1 s (~15 s)
    python bench/server_suspend.py --quick    # X = 0, 200, 1500 ms

Writes ``bench/results/server_suspend.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)

RESULTS = ROOT / "bench" / "results" / "server_suspend.json"

from bench._stats import cell, pct  # noqa: E402


def run_one(suspend_ms: float, *, clients: int, gen_ms: float, timeout_s: float, awake_s: float) -> dict:
    import openai

    from colo_fsm.adapters.protocols import Completion
    from colo_fsm.server import GatedEngine, overlaps
    from colo_fsm.testing.fakes import RecordingEngine

    class Gen:
        def __init__(self, engine: RecordingEngine) -> None:
            self.engine = engine
            self.mid_handoff = 0

        def generate(self, prompts, *, max_tokens, temperature=0.0, seed=None):  # type: ignore[no-untyped-def]
            if self.engine.condition != "awake":
                self.mid_handoff += 1
            time.sleep(gen_ms / 1e3)
            if self.engine.condition != "awake":
                self.mid_handoff += 1
            return [Completion(p[:max_tokens], (1,) * max_tokens, 0) for p in prompts]

    engine = RecordingEngine()
    gen = Gen(engine)
    gated = GatedEngine(engine, gen, serve=True, record=True, request_timeout_s=timeout_s, retry_after_s=1)
    gated.bring_up()
    url = gated.server_base_urls()[0]
    stop = threading.Event()
    rows: list[tuple[float, float, int]] = []  # (t_sent, latency, status)
    lock = threading.Lock()

    def client() -> None:
        c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=timeout_s + 30)
        while not stop.is_set():
            t0 = time.time()
            status = 200
            try:
                c.completions.create(model="m", prompt="hello", max_tokens=4)
            except openai.APIStatusError as exc:
                status = exc.status_code
            except openai.APIError:
                status = -1
            with lock:
                rows.append((t0, time.time() - t0, status))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(awake_s)
    t_suspend = time.time()
    drain_s = None
    if suspend_ms > 0:
        gated.suspend()
        drain_s = gated.suspend_drain_s[-1]
        time.sleep(suspend_ms / 1e3)
        gated.resume()
    t_resume = time.time()
    time.sleep(awake_s)
    stop.set()
    for t in threads:
        t.join(timeout_s + 30)
    bad = overlaps(gated.gate.served, gated.gate.closed_periods())
    gated.shutdown()

    ok = [r for r in rows if r[2] == 200]
    # awake: sent and answered outside the suspend window; queued: sent before the resume and answered after it
    awake = [lat for t0, lat, st in ok if t0 + lat < t_suspend or t0 > t_resume]
    queued = [lat for t0, lat, st in ok if t0 < t_resume and t0 + lat > t_resume and suspend_ms > 0]
    return {
        "suspend_ms": suspend_ms,
        "requests": len(rows),
        "served": len(ok),
        "served_after_waiting": len(queued),
        "503": sum(1 for r in rows if r[2] == 503),
        "other_errors": sum(1 for r in rows if r[2] not in (200, 503)),
        "awake_p50_ms": pct(awake, 50) * 1e3,
        "awake_p99_ms": pct(awake, 99) * 1e3,
        "queued_p50_ms": pct(queued, 50) * 1e3,
        "queued_max_ms": max(queued) * 1e3 if queued else float("nan"),
        "suspend_drain_ms": None if drain_s is None else drain_s * 1e3,
        "served_mid_handoff": gen.mid_handoff,
        "served_while_closed": len(bad),
        "mean_latency_ms": statistics.fmean(r[1] for r in ok) * 1e3 if ok else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--suspend-ms", type=float, nargs="*", default=None)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--gen-ms", type=float, default=20.0)
    ap.add_argument("--request-timeout", type=float, default=1.0)
    ap.add_argument("--awake", type=float, default=None, help="seconds awake before and after the suspend")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    xs = args.suspend_ms if args.suspend_ms is not None else ([0, 200, 1500] if args.quick else [0, 100, 500, 2000])
    awake = args.awake if args.awake is not None else (0.5 if args.quick else 1.0)
    results = [
        run_one(x, clients=args.clients, gen_ms=args.gen_ms, timeout_s=args.request_timeout, awake_s=awake) for x in xs
    ]
    print(
        f"\nOpenAI-compatible server across a suspend: {args.clients} openai-client threads, generation "
        f"{args.gen_ms:g} ms/request, request timeout {args.request_timeout:g} s (then 503 + Retry-After)\n"
    )
    print(
        "| suspend ms | requests | served | served after waiting | 503 | other errors | awake p50 / p99 ms | "
        "queued p50 / max ms | suspend drain ms | served mid-handoff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ms = {k: cell(r[k], "{:.1f}") for k in ("awake_p50_ms", "awake_p99_ms", "queued_p50_ms", "queued_max_ms")}
        print(
            f"| {r['suspend_ms']:g} | {r['requests']} | {r['served']} | {r['served_after_waiting']} | {r['503']} | "
            f"{r['other_errors']} | {ms['awake_p50_ms']} / {ms['awake_p99_ms']} | "
            f"{ms['queued_p50_ms']} / {ms['queued_max_ms']} | {cell(r['suspend_drain_ms'], '{:.1f}')} | "
            f"{r['served_mid_handoff'] + r['served_while_closed']} |"
        )
    payload = {
        "provenance": prov,
        "benchmark": "server_suspend",
        "config": {
            "clients": args.clients,
            "gen_ms": args.gen_ms,
            "request_timeout_s": args.request_timeout,
            "awake_s": awake,
        },
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg": os.getloadavg(),
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    ok = all(r["other_errors"] == 0 and r["served_mid_handoff"] == 0 and r["served_while_closed"] == 0 for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
