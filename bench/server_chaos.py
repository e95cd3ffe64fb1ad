"""Gym chaos against the CPU demo's OpenAI-compatible server for a fixed time, with training's step rate beside it.

Runs ``colo-fsm demo --serve`` on the CPU (one rank) and alternates, ``--rounds`` times, a quiet phase of
``--baseline-s`` seconds (no HTTP traffic: training's idle step rate) and a chaos phase of ``--chaos-s`` seconds
(the order flips each round; training's ratio is the median of the rounds' own chaos / quiet ratios, so a busy
machine's load drift cancels) in which these clients run at once:

* ``small``: a probe, a 3-token request (``"12>"``, ``max_tokens=3``) every 0.2 s (the next one as soon as the
  last is answered when that takes longer): their latency is the small-request wait;
* ``hog``: the largest legal ``n=64`` request, back to back from one client (half the token budget, all the time);
* ``mixed``: Poisson arrivals of completions and chat, streamed or not, ``n`` up to 3, a quarter abandoned at a
  random point (closed before the answer or after a few stream chunks);
* ``reset``: requests whose connection is reset (RST) after a random delay;
* ``handoff``: requests held open and closed as soon as ``/health`` (polled every 0.1 s) says the server is in a
  handoff;
* ``slow``: streams of ``n=4`` read 64 bytes every 0.1 s;
* ``burst``: every 3 s, 16 requests at once;
* ``stall``: uploads that stop half-way; the client gives up after 0.5-2 s.

``/metrics`` is scraped every ``--scrape-s`` seconds through the whole run (Prometheus' text parser) and the series
are written to ``bench/results/server_chaos_series.json`` (``scripts/render_server_dashboard.py`` draws the Grafana
dashboard's panels from them). The result, ``bench/results/server_chaos.json``: requests by outcome as the clients
saw them and as the server counted them (``colo_fsm_http_requests_total``, client outcomes by stage), server errors,
training's step-rate ratio (chaos / quiet), the small-request wait p50/p99, the demo's RSS at start and end, the
load average. Bars: 0 server errors, ratio >= 0.75, small-request wait p50 <= 1 s. Exit 1 when the demo fails or a
server error is seen.

    python bench/server_chaos.py             # 5 rounds x (10 s quiet + 20 s chaos), ~3 min
    python bench/server_chaos.py --quick     # 2 rounds x (6 s + 12 s)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository, for bench.* and colo_fsm
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._demo import Demo, cpu_seconds, machine, scrape, steps_in, total  # noqa: E402
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from bench._stats import median, pct  # noqa: E402
from colo_fsm.demo.config import DEMO_SERVER_SHARE  # noqa: E402
from tests.support.chaos import http_request, read_all, status_of  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "server_chaos.json"
SERIES = ROOT / "bench" / "results" / "server_chaos_series.json"
SMALL = {"prompt": "12>", "max_tokens": 3}
RATIO_BAR = 0.75
READ_WITHIN_S = 300.0  # a response that sends nothing for this long is read as what came so far
SMALL_BAR_S = 1.0


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Tally:
    """What the clients saw, by actor and result; the small requests' latencies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.results: Counter[tuple[str, str]] = Counter()
        self.small: list[tuple[float, float]] = []  # (sent at, latency s) of answered small requests
        self.in_handoff = 0  # connections closed while /health said "handoff"
        self.bad: list[str] = []

    def add(self, actor: str, result: str, detail: str = "") -> None:
        with self.lock:
            self.results[(actor, result)] += 1
            if result in ("5xx", "broken") and len(self.bad) < 20:
                self.bad.append(f"{actor}: {result} {detail[:300]}")

    def judge(self, actor: str, raw: bytes, stream: bool) -> str:
        code = status_of(raw)
        if code is None:
            result = "broken"
        elif code == 200:
            result = "200" if (not stream or b"data: [DONE]" in raw) and b'"error"' not in raw else "stream-error"
        elif code >= 500 and code != 503:
            result = "5xx"
        else:
            result = str(code)
        self.add(actor, result, raw[:300].decode(errors="replace"))
        return result


class Chaos:
    """The chaos clients against one server; they run while :attr:`on` is set, until :attr:`done`."""

    def __init__(self, url: str, port: int, limit: int, seed: int, without: frozenset[str] = frozenset()) -> None:
        self.url = url
        self.root = url.removesuffix("/v1")
        self.port = port
        self.hog_body = {"prompt": "123>", "n": 64, "max_tokens": max(1, min(28, limit // 64 - 4)), "temperature": 1.0}
        self.seed = seed
        self.without = without
        self.on = threading.Event()
        self.done = threading.Event()
        self.tally = Tally()

    def idle(self) -> bool:
        """Wait while the phase is quiet; False once the run is over."""
        while not self.on.is_set():
            if self.done.wait(0.05):
                return False
        return not self.done.is_set()

    def actors(self) -> list[tuple[str, Callable[[random.Random], None]]]:
        return [
            ("small", self.small),
            ("hog", self.hog),
            ("mixed", self.mixed),
            ("mixed", self.mixed),
            ("reset", self.reset),
            ("handoff", self.handoff),
            ("slow", self.slow),
            ("burst", self.burst),
            ("stall", self.stall),
        ]

    def small(self, rng: random.Random) -> None:
        import httpx

        with httpx.Client(timeout=300) as h:
            while self.idle():
                t0 = time.time()
                try:
                    r = h.post(self.url + "/completions", json=SMALL)
                except httpx.HTTPError as exc:
                    self.tally.add("small", "broken", repr(exc))
                    continue
                code = r.status_code
                self.tally.add("small", str(code) if code < 500 or code == 503 else "5xx", r.text)
                if code == 200 and self.on.is_set():
                    with self.tally.lock:
                        self.tally.small.append((t0, time.time() - t0))
                time.sleep(max(0.0, 0.2 - (time.time() - t0)))  # a probe every 0.2 s (or as soon as answered)

    def hog(self, rng: random.Random) -> None:
        import httpx

        with httpx.Client(timeout=600) as h:
            while self.idle():
                try:
                    r = h.post(self.url + "/completions", json=self.hog_body)
                    self.tally.add("hog", str(r.status_code) if r.status_code < 500 or r.status_code == 503 else "5xx")
                except httpx.HTTPError as exc:
                    self.tally.add("hog", "broken", repr(exc))

    def body(self, rng: random.Random, *, stream: bool, n: int, max_tokens: int) -> tuple[str, dict[str, Any]]:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
        common: dict[str, Any] = {"max_tokens": max_tokens, "n": n, "stream": stream, "temperature": 1.0}
        if rng.random() < 0.5:
            return "/v1/completions", {"prompt": digits + ">", **common}
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": digits}], **common}

    def mixed(self, rng: random.Random) -> None:
        while self.idle():
            time.sleep(rng.expovariate(4.0))
            stream = rng.random() < 0.5
            path, body = self.body(rng, stream=stream, n=rng.choice((1, 1, 2, 3)), max_tokens=rng.randint(1, 12))
            try:
                sock = http_request(self.port, path, body)
            except OSError as exc:
                self.tally.add("mixed", "broken", repr(exc))
                continue
            if rng.random() < 0.25:  # abandoned at a random point
                if stream:
                    sock.settimeout(60)
                    try:
                        for _ in range(rng.randint(0, 3)):
                            if not sock.recv(rng.randint(1, 400)):
                                break
                    except OSError:
                        pass
                else:
                    time.sleep(rng.uniform(0.0, 0.5))
                sock.close()
                self.tally.add("mixed", "abandoned")
                continue
            raw = read_all(sock, READ_WITHIN_S)
            sock.close()
            self.tally.judge("mixed", raw, stream)

    def reset(self, rng: random.Random) -> None:
        while self.idle():
            path, body = self.body(rng, stream=rng.random() < 0.5, n=2, max_tokens=20)
            try:
                sock = http_request(self.port, path, body)
            except OSError as exc:
                self.tally.add("reset", "broken", repr(exc))
                continue
            time.sleep(rng.uniform(0.0, 1.0))
            reset(sock)
            self.tally.add("reset", "abandoned")

    def handoff(self, rng: random.Random) -> None:
        import httpx

        with httpx.Client(timeout=30) as h:
            while self.idle():
                socks = []
                for _ in range(2):
                    path, body = self.body(rng, stream=rng.random() < 0.5, n=2, max_tokens=24)
                    try:
                        socks.append(http_request(self.port, path, body))
                    except OSError as exc:
                        self.tally.add("handoff", "broken", repr(exc))
                deadline = time.monotonic() + 10
                seen = False
                while time.monotonic() < deadline and self.on.is_set():
                    try:
                        seen = h.get(self.root + "/health").json().get("status") == "handoff"
                    except (httpx.HTTPError, ValueError):
                        seen = False
                    if seen:
                        break
                    time.sleep(0.1)
                for sock in socks:
                    sock.close()
                    self.tally.add("handoff", "abandoned")
                if seen:
                    with self.tally.lock:
                        self.tally.in_handoff += len(socks)

    def slow(self, rng: random.Random) -> None:
        while self.idle():
            path, body = self.body(rng, stream=True, n=4, max_tokens=20)
            try:
                sock = http_request(self.port, path, body)
            except OSError as exc:
                self.tally.add("slow", "broken", repr(exc))
                continue
            sock.settimeout(120)
            raw = b""
            try:
                while chunk := sock.recv(64):
                    raw += chunk
                    time.sleep(0.1)
            except OSError:
                pass
            sock.close()
            self.tally.judge("slow", raw, True)

    def burst(self, rng: random.Random) -> None:
        while self.idle():
            if self.done.wait(3.0) or not self.on.is_set():
                continue
            threads = []
            for i in range(16):
                path, body = self.body(rng, stream=i % 3 == 0, n=rng.choice((1, 2)), max_tokens=rng.randint(1, 8))
                threads.append(threading.Thread(target=self._one, args=("burst", path, body), daemon=True))
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)

    def _one(self, actor: str, path: str, body: dict[str, Any]) -> None:
        try:
            sock = http_request(self.port, path, body)
        except OSError as exc:
            self.tally.add(actor, "broken", repr(exc))
            return
        raw = read_all(sock, READ_WITHIN_S)
        sock.close()
        self.tally.judge(actor, raw, bool(body.get("stream")))

    def stall(self, rng: random.Random) -> None:
        while self.idle():
            path, body = self.body(rng, stream=False, n=1, max_tokens=4)
            try:
                sock = http_request(self.port, path, body, partial=rng.randint(1, 20))
            except OSError as exc:
                self.tally.add("stall", "broken", repr(exc))
                continue
            time.sleep(rng.uniform(0.5, 2.0))
            sock.close()
            self.tally.add("stall", "abandoned")

    def start(self) -> list[threading.Thread]:
        threads = []
        for i, (name, fn) in enumerate(self.actors()):
            if name in self.without:
                continue
            rng = random.Random(self.seed * 1000 + i)
            threads.append(threading.Thread(target=fn, args=(rng,), name=f"chaos-{name}-{i}", daemon=True))
        for t in threads:
            t.start()
        return threads


class Scraper:
    """Scrapes ``/metrics`` every ``every_s`` seconds into a list of ``(time, samples)``."""

    def __init__(self, root: str, every_s: float) -> None:
        self.root = root
        self.every_s = every_s
        self.series: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=30) as h:
            while not self.stop.is_set():
                t = time.time()
                try:
                    self.series.append({"t": t, "samples": scrape(self.root, h)})
                except Exception as exc:  # a scrape that fails or does not parse is a finding
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                self.stop.wait(max(0.0, self.every_s - (time.time() - t)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-s", type=float, default=10.0)
    ap.add_argument("--chaos-s", type=float, default=20.0)
    ap.add_argument("--scrape-s", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 6 s quiet + 12 s chaos")
    ap.add_argument("--without", default="", help="comma-separated clients to leave out (e.g. hog,burst)")
    ap.add_argument(
        "--nice",
        type=int,
        default=19,
        help="the load generator's CPU niceness (default 19: in a gym farm the clients run on other machines; "
        "here they share the demo's cores, at the lowest priority); 0 to compete with the demo as an equal",
    )
    ap.add_argument(
        "--server-share",
        type=float,
        default=DEMO_SERVER_SHARE,
        help=f"the demo's --server-share (the share of the engine's slots HTTP requests may hold; default "
        f"{DEMO_SERVER_SHARE}, the demo's)",
    )
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--series-out", default=str(SERIES))
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    if args.quick:
        args.rounds, args.baseline_s, args.chaos_s = 2, 6.0, 12.0
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="server-chaos-"))
    demo = Demo(tmp / "run", args.threads, extra=("--server-share", str(args.server_share)))
    phases: list[tuple[str, float, float]] = []
    cpu = {"quiet": [0.0, 0.0, 0.0], "chaos": [0.0, 0.0, 0.0]}  # load generator CPU s, demo CPU s, wall s
    rss: dict[str, int | None] = {}
    load_start = machine()["load_avg"]
    chaos: Chaos | None = None
    scraper: Scraper | None = None
    threads: list[threading.Thread] = []
    final: dict[str, Any] = {}
    health: dict[str, Any] = {}
    failure: str | None = None
    try:
        url = demo.url()
        root = url.removesuffix("/v1")
        port = int(root.rsplit(":", 1)[1])
        limit = int(httpx.get(root + "/health", timeout=60).json()["max_request_tokens"])
        demo.warm_up()
        if args.nice:
            os.nice(args.nice)  # this process only: the demo was started before, at the normal priority
        rss["start"] = demo.rss()
        scraper = Scraper(root, args.scrape_s)
        scraper.thread.start()
        chaos = Chaos(url, port, limit, args.seed, frozenset(x for x in args.without.split(",") if x))
        threads = chaos.start()
        for r in range(args.rounds):
            for kind in ("quiet", "chaos") if r % 2 == 0 else ("chaos", "quiet"):
                if kind == "chaos":
                    chaos.on.set()
                else:
                    chaos.on.clear()
                t0 = time.time()
                c0 = (time.process_time(), cpu_seconds(demo.proc.pid))
                time.sleep(args.chaos_s if kind == "chaos" else args.baseline_s)
                c1 = (time.process_time(), cpu_seconds(demo.proc.pid))
                phases.append((kind, t0, time.time()))
                cpu[kind][0] += c1[0] - c0[0]
                cpu[kind][1] += (c1[1] or 0.0) - (c0[1] or 0.0)
                cpu[kind][2] += phases[-1][2] - t0
                print(f"round {r} {kind}: {len([s for s in demo.step_times() if t0 <= s])} steps", flush=True)
        chaos.on.clear()
        chaos.done.set()
        for t in threads:
            t.join(300)
        time.sleep(2 * args.scrape_s)  # the last answers counted
        final = scrape(root)
        health = httpx.get(root + "/health", timeout=60).json()
        rss["end"] = demo.rss()
        if demo.proc.poll() is not None:
            failure = f"the demo exited during the run ({demo.proc.returncode})"
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        if chaos is not None:
            chaos.done.set()
        if scraper is not None:
            scraper.stop.set()
            scraper.thread.join(30)
        steps = demo.step_times()
        rc = demo.stop()
    if failure is not None or chaos is None:
        print(f"the chaos run failed: {failure}\n{demo.stderr_path.read_text()[-3000:]}", file=sys.stderr)
        return 1
    quiet_steps, quiet_s = steps_in(steps, [(a, b) for k, a, b in phases if k == "quiet"])
    chaos_steps, chaos_s = steps_in(steps, [(a, b) for k, a, b in phases if k == "chaos"])
    quiet_rate = quiet_steps / quiet_s if quiet_s else float("nan")
    chaos_rate = chaos_steps / chaos_s if chaos_s else float("nan")
    per_round = []  # each round's chaos rate over its own quiet rate: load drift between rounds cancels
    for r in range(args.rounds):
        (qn, qs), (cn, cs) = (
            steps_in(steps, [(a, b) for k, a, b in phases[2 * r : 2 * r + 2] if k == kind])
            for kind in ("quiet", "chaos")
        )
        per_round.append((cn / cs) / (qn / qs) if qn and qs and cs else float("nan"))
    small = [lat for _, lat in chaos.tally.small]
    by_outcome = {
        lab["outcome"]: int(total(final, "colo_fsm_http_requests_total", outcome=lab["outcome"]))
        for lab, _ in final.get("colo_fsm_http_requests_total", [])
    }
    by_stage: Counter[str] = Counter()
    for lab, v in final.get("colo_fsm_http_client_outcomes_total", []):
        by_stage[f"{lab.get('stage')}/{lab.get('reason')}"] += int(v)
    client_5xx = sum(n for (_, res), n in chaos.tally.results.items() if res in ("5xx", "broken", "stream-error"))
    server_errors = by_outcome.get("error", 0)
    result = {
        "provenance": prov,
        "bench": "server_chaos",
        "machine": machine(),
        "load_avg_start": load_start,
        "rounds": args.rounds,
        "server_share": args.server_share,
        "baseline_s": args.baseline_s,
        "chaos_s": args.chaos_s,
        "max_request_tokens": limit,
        "hog_request": chaos.hog_body,
        "server": {
            "requests_by_outcome": by_outcome,
            "client_outcomes_by_stage": dict(by_stage),
            "server_errors": server_errors,
            "ledger": health.get("requests"),
            "tokens_held_at_end": health.get("tokens", {}).get("held_tokens"),
            "engine_requests_at_end": health.get("engine_requests"),
            "handoffs": health.get("handoffs", {}).get("count"),
        },
        "clients": {
            "results": {f"{a}/{r}": n for (a, r), n in sorted(chaos.tally.results.items())},
            "closed_inside_a_handoff": chaos.tally.in_handoff,
            "server_errors_seen": client_5xx,
            "bad": chaos.tally.bad,
        },
        "training": {
            "quiet_steps_per_s": quiet_rate,
            "chaos_steps_per_s": chaos_rate,
            "pooled_ratio": chaos_rate / quiet_rate if quiet_rate else float("nan"),
            "ratio_per_round": per_round,
            "ratio": median(per_round),
        },
        "small_request_wait_s": {
            "n": len(small),
            "p50": median(small),
            "p99": pct(small, 99),
            "max": max(small) if small else float("nan"),
        },
        "rss_bytes": rss,
        "cores_used": {  # CPU seconds per wall second: what the demo and this load generator used of the machine
            kind: {"demo": round(d / w, 2) if w else None, "load_generator": round(g / w, 2) if w else None}
            for kind, (g, d, w) in cpu.items()
        },
        "load_generator_nice": args.nice,
        "clients_left_out": sorted(chaos.without),
        "scrapes": len(scraper.series) if scraper else 0,
        "scrape_errors": scraper.errors[:5] if scraper else [],
        "demo_exit_code": rc,
    }
    ratio = result["training"]["ratio"]
    p50 = result["small_request_wait_s"]["p50"]
    result["bars"] = {
        "server_errors": server_errors + client_5xx,
        "ratio": ratio,
        "ratio_bar": RATIO_BAR,
        "small_p50_s": p50,
        "small_bar_s": SMALL_BAR_S,
        "met": bool(server_errors + client_5xx == 0 and ratio >= RATIO_BAR and p50 <= SMALL_BAR_S),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if scraper is not None:
        series = {"provenance": prov, "phases": phases, "scrapes": scraper.series}
        Path(args.series_out).write_text(json.dumps(series) + "\n")
    print(f"\n{'outcome (server)':24s} {'requests':>9s}")
    for k, v in sorted(by_outcome.items()):
        print(f"{k:24s} {v:9d}")
    print(f"client outcomes by stage: {dict(by_stage)}; closed inside a handoff: {chaos.tally.in_handoff}")
    print(
        f"training {quiet_rate:.2f} -> {chaos_rate:.2f} steps/s (ratio {ratio:.2f}, median of rounds "
        f"{[round(x, 2) for x in per_round]}, bar {RATIO_BAR}); "
        f"small-request wait p50 {p50:.3f} s p99 {result['small_request_wait_s']['p99']:.3f} s (bar {SMALL_BAR_S} s, "
        f"n={len(small)}); server errors {server_errors} (clients saw {client_5xx}); RSS {rss}; "
        f"cores used {result['cores_used']}; "
        f"load average {result['machine']['load_avg'][0]:.1f}; wrote {args.out}"
    )
    if server_errors or client_5xx or scraper is None or scraper.errors or rc not in (0, 143):
        print(f"server errors or a failed scrape: {chaos.tally.bad[:5]} {scraper.errors[:3] if scraper else ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
