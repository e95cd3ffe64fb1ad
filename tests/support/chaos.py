"""Gym-like chaos against the CPU demo's OpenAI-compatible server, in one process (run it as a subprocess).

The demo (:func:`colo_fsm.demo.run.run_rank`, one rank, ``--serve``) trains while several clients send requests
with Poisson arrivals: completions and chat, streamed or not, ``n`` up to 3. A share of them is abandoned at a
random point (the socket closed before the answer, or after a few stream chunks). Besides, *handoff victims* are
abandoned exactly while the engine is suspended: the demo's :class:`~colo_fsm.server.GatedEngine` is replaced by a
subclass whose ``suspend()`` calls a hook once the engine is suspended (requests parked); the hook closes the
sockets of victims whose engine requests are parked (found by their reserved seeds), then waits until the engine
has every one of those requests resolved as aborted, before the lifecycle goes on to train. No sleeping and
hoping: each forced cancel lands during a handoff.

The report (JSON) says whether the run finished, the decode steps run while suspended, gate spans served during a
closed period, the server's ledger (every admitted request answered, aborted or failed, none twice), what the
clients saw, and the HTTP requests left in the engine once the clients stopped.

    python -m tests.support.chaos --steps 300 --out report.json
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

VICTIM_SEED0 = 7_000_000  # victims' seeds: VICTIM_SEED0 + 10 * victim id + choice index
HOLD_S = 300.0  # the longest training holds for the clients to stop (their joins and waits take at most 240 s)


def post_bytes(path: str, body: dict[str, Any], *, close: bool, partial: int | None = None) -> bytes:
    """One raw HTTP/1.1 POST of ``body`` as JSON; ``close`` adds ``Connection: close`` (else the connection is
    kept alive, HTTP/1.1's default); with ``partial`` only that many body bytes are included."""
    data = json.dumps(body).encode()
    connection = "Connection: close\r\n" if close else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n{connection}\r\n"
    )
    return head.encode() + (data if partial is None else data[:partial])


def http_request(port: int, path: str, body: dict[str, Any], partial: int | None = None) -> socket.socket:
    """Send one POST on a fresh connection (``Connection: close``); with ``partial`` only that many body bytes are
    sent. The caller reads or closes the socket."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(post_bytes(path, body, close=True, partial=partial))
    return sock


def read_all(sock: socket.socket, within_s: float | None = None) -> bytes:
    """Everything until the server closes (``Connection: close``), or what came before an error or before
    ``within_s`` passed without data (``None``: the socket's own timeout)."""
    if within_s is not None:
        sock.settimeout(within_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except OSError:
        pass
    return out


def status_of(raw: bytes) -> int | None:
    """The status code of a raw HTTP response (None when nothing came back)."""
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


class Chaos:
    """Clients, victims and the suspend hook around one serving demo run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.gated: Any = None
        self.handles: dict[int, Any] = {}  # engine handles of victims' choices, by seed
        self.victims: list[dict[str, Any]] = []
        self.sent = self.answered = self.refused = self.abandoned = self.broken = 0
        self.forced = 0  # victims whose parked engine requests were cancelled during a handoff
        self.suspends = 0
        self.bad: list[str] = []  # answers that were neither complete nor a refusal in OpenAI's shape
        self.server_left: list[Any] = []  # HTTP requests in the engine at the last checks, once clients stopped
        self.clients_done = threading.Event()
        self.checks_after_clients = 0

    # ------------------------------------------------------------------ the hooked engine
    def install(self) -> None:
        import colo_fsm.server as server_pkg

        chaos = self

        class Recording:
            """The engine the server sees: records the handles of victims' choices by seed."""

            def __init__(self, inner: Any) -> None:
                self._inner = inner

            def __getattr__(self, name: str) -> Any:
                return getattr(self._inner, name)

            def submit(self, prompt_ids: Any, **kw: Any) -> Any:
                h = self._inner.submit(prompt_ids, **kw)
                seed = kw.get("seed")
                if seed is not None and seed >= VICTIM_SEED0:
                    with chaos.lock:
                        chaos.handles[int(seed)] = h
                return h

        base = server_pkg.GatedEngine

        class ChaosGated(base):  # type: ignore[misc, valid-type]
            def __init__(self, engine: Any, generator: Any, **kw: Any) -> None:
                kw["record"] = True
                if chaos.args.inflight_tokens:  # a small budget: requests wait, some get 429 or 503
                    kw["settings"] = replace(kw["settings"], max_inflight_tokens=chaos.args.inflight_tokens)
                    kw["request_timeout_s"] = chaos.args.request_timeout
                super().__init__(engine, Recording(generator), **kw)
                chaos.gated = self

            def suspend(self) -> None:
                chaos.hold_until_clients_done()
                super().suspend()
                chaos.on_suspended()

        server_pkg.GatedEngine = ChaosGated  # type: ignore[misc]  # run_rank imports it from colo_fsm.server

    @property
    def stop_step(self) -> int:
        """The training step from which the clients are told to stop, leaving steps whose handoffs check the engine."""
        return int(self.args.steps - max(6, self.args.steps // 10))

    def step(self) -> int:
        """The demo's training step as the server's status reports it (0 before the first)."""
        st = self.gated._status() if self.gated is not None and self.gated._status is not None else None
        return int(getattr(st, "step", 0) or 0)

    def hold_until_clients_done(self) -> None:
        """On the lifecycle thread, before a handoff: from :attr:`stop_step` on, training waits here until the
        clients have stopped and their requests have ended (the engine keeps serving meanwhile), so a handoff always
        comes after them and checks the engine, however slow the machine (the run could otherwise end first)."""
        if self.clients_done.is_set() or self.step() < self.stop_step:
            return
        if not self.clients_done.wait(HOLD_S):
            self.bad.append(f"the clients had not stopped {HOLD_S:.0f} s after training reached step {self.step()}")

    def on_suspended(self) -> None:
        """On the lifecycle thread, the engine suspended with requests parked: abandon parked victims now."""
        self.suspends += 1
        if self.clients_done.is_set():
            self.check_engine_left()
        with self.lock:
            parked = [
                v
                for v in self.victims
                if not v["closed"]
                and v["handles"]
                and all(self.handles.get(s) is not None and not self.handles[s].done() for s in v["handles"])
            ]
        for v in parked[: max(1, len(parked) - 1)]:  # leave one parked: the engine keeps work to resume
            v["closed"] = True
            try:
                v["sock"].shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            v["sock"].close()
            deadline = time.monotonic() + 60
            while not all(self.handles[s].done() for s in v["handles"]):
                if time.monotonic() > deadline:
                    self.bad.append(f"victim {v['id']}: its engine requests were not cancelled within 60 s")
                    break
                time.sleep(0.005)
            else:
                self.forced += 1

    def check_engine_left(self) -> None:
        """After the clients stopped: the HTTP requests still queued, running or parked in the engine."""
        from colo_fsm.adapters.batching import Priority

        self.checks_after_clients += 1
        try:
            counts = self.gated.inner.request_counts(Priority.SERVER)
        except TypeError:  # an engine without per-priority counts
            counts = None
        self.server_left.append(list(counts) if counts is not None else None)

    # ------------------------------------------------------------------ clients
    def body(self, rng: random.Random, *, stream: bool, n: int, max_tokens: int) -> tuple[str, dict[str, Any]]:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
        common: dict[str, Any] = {"max_tokens": max_tokens, "n": n, "stream": stream, "temperature": 1.0}
        if rng.random() < 0.5:
            return "/v1/completions", {"prompt": digits + ">", **common}
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": digits}], **common}

    def client(self, i: int, port: int) -> None:
        rng = random.Random(self.args.seed * 1000 + i)
        while not self.stop.wait(rng.expovariate(self.args.rate)):
            stream = rng.random() < 0.5
            path, body = self.body(rng, stream=stream, n=rng.choice((1, 1, 2, 3)), max_tokens=rng.randint(1, 12))
            try:
                sock = http_request(port, path, body)
            except OSError:  # the server is gone (the run ended or failed): stop sending
                return
            with self.lock:
                self.sent += 1
            if rng.random() < self.args.abandon:  # abandoned at a random point
                if stream:
                    sock.settimeout(60)
                    with _suppress_os():
                        for _ in range(rng.randint(0, 3)):
                            if not sock.recv(rng.randint(1, 400)):
                                break
                else:
                    time.sleep(rng.uniform(0.0, 0.3))
                sock.close()
                with self.lock:
                    self.abandoned += 1
                continue
            raw = read_all(sock)
            sock.close()
            self.judge(raw, stream)

    def judge(self, raw: bytes, stream: bool) -> None:
        code = status_of(raw)
        with self.lock:
            if code == 200 and (not stream or b"data: [DONE]" in raw) and b'"error"' not in raw:
                self.answered += 1
            elif code in (429, 503) and b'"error"' in raw and b'"param"' in raw:
                self.refused += 1
            elif code is None:
                self.broken += 1
                self.bad.append("a connection closed without an answer")
            else:
                self.bad.append(f"status {code} (stream={stream}): {raw[:200]!r} ... {raw[-1200:]!r}")

    def victim_client(self, port: int) -> None:
        rng = random.Random(self.args.seed * 7919)
        vid = 0
        while not self.stop.is_set():
            with self.lock:
                live = [v for v in self.victims if not v["closed"] and not v["finished"]]
            if len(live) >= 2:
                time.sleep(0.01)
                continue
            vid += 1
            stream = vid % 2 == 0
            path, body = self.body(rng, stream=stream, n=2, max_tokens=26)
            body["seed"] = VICTIM_SEED0 + 10 * vid
            try:
                sock = http_request(port, path, body)
            except OSError:
                return
            with self.lock:
                self.sent += 1
            v = {
                "id": vid,
                "sock": sock,
                "closed": False,
                "finished": False,
                "handles": [body["seed"], body["seed"] + 1],
            }
            with self.lock:
                self.victims.append(v)
            threading.Thread(target=self.victim_reader, args=(v, stream), daemon=True).start()

    def victim_reader(self, v: dict[str, Any], stream: bool) -> None:
        raw = read_all(v["sock"])
        with self.lock:
            v["finished"] = True
            closed = v["closed"]
        if not closed:
            self.judge(raw, stream)


class _suppress_os:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, OSError)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second per client (Poisson)")
    ap.add_argument("--abandon", type=float, default=0.25, help="share of requests abandoned at a random point")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--inflight-tokens", type=int, default=0, help="the server's max_inflight_tokens (0: default)")
    ap.add_argument("--request-timeout", type=float, default=2.0, help="with --inflight-tokens: request_timeout_s")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from colo_fsm.demo.config import DemoConfig
    from colo_fsm.demo.run import run_rank
    from colo_fsm.server.gate import overlaps

    chaos = Chaos(args)
    chaos.install()
    cfg = DemoConfig(
        steps=args.steps,
        num_prompts_per_step=4,
        samples_per_group=4,
        validate_every=1_000_000,
        checkpoint_every=1_000_000,
        threads=1,
        tensorboard=False,
        serve=True,
        run_dir=args.run_dir,
    )
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            res = run_rank(cfg, run_dir)
            outcome["end_step"] = res.end_step if res is not None else None
        except BaseException as exc:
            outcome["error"] = "".join(traceback.format_exception_only(exc)).strip()

    t0 = time.monotonic()
    runner = threading.Thread(target=run, name="demo")
    runner.start()
    while chaos.gated is None or chaos.gated.server is None or not chaos.gated.server.running:
        if not runner.is_alive():
            break
        time.sleep(0.05)
    threads: list[threading.Thread] = []
    if runner.is_alive():
        port = chaos.gated.server.port
        threads = [threading.Thread(target=chaos.client, args=(i, port), daemon=True) for i in range(args.clients)]
        threads.append(threading.Thread(target=chaos.victim_client, args=(port,), daemon=True))
        for t in threads:
            t.start()

        while runner.is_alive() and chaos.step() < chaos.stop_step:  # training then holds until clients_done
            time.sleep(0.05)
        chaos.stop.set()
        for t in threads:
            t.join(120)
        deadline = time.monotonic() + 60
        for v in list(chaos.victims):
            if not v["closed"]:
                while not v["finished"] and time.monotonic() < deadline:
                    time.sleep(0.01)
        ctx = chaos.gated.server.app.state.ctx
        while ctx.ledger.open_requests and time.monotonic() < deadline and runner.is_alive():
            time.sleep(0.01)
        chaos.clients_done.set()
    runner.join(600)
    gated = chaos.gated
    ctx = gated.server.app.state.ctx if gated is not None and gated.server is not None else None
    engine = gated.inner if gated is not None else None
    report = {
        "steps": args.steps,
        "seconds": round(time.monotonic() - t0, 1),
        "run": outcome,
        "suspends": chaos.suspends,
        "clients": {
            "sent": chaos.sent,
            "answered": chaos.answered,
            "refused_429_503": chaos.refused,
            "abandoned_at_random": chaos.abandoned,
            "forced_handoff_aborts": chaos.forced,
            "broken": chaos.broken,
            "bad": chaos.bad[:10],
        },
        "ledger": ctx.ledger.counters() if ctx is not None else None,
        "tokens_held_at_end": ctx.budget.held if ctx is not None else None,
        "decode_steps_while_suspended": engine.steps_while_suspended if engine is not None else None,
        "served_during_closed_gate": len(overlaps(gated.gate.served, gated.gate.closed_periods())) if gated else None,
        "server_requests_in_engine_after_clients": chaos.server_left,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
