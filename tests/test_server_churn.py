"""Client churn is not a server error. A client that closes, resets or times out at each point of the exchange
(upload, queue for the token budget, queue at a suspended engine's gate, generation, stream) is counted as a
client outcome at that stage: no 500, no ERROR log, no ``error`` in ``/health``, its engine requests cancelled and
their slots freed. Each point is forced: the client leaves only once the server shows the request in that stage
(never by sleeping and hoping)."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import pytest
from _server_fake import FakeEngine, serve_fake

from colo_fsm.server import ServerSettings
from tests.support import waits
from tests.support.chaos import post_bytes


class ErrorLogs(logging.Handler):
    """Collects ERROR (and worse) records from colo-fsm's and uvicorn's loggers, whichever thread logs them."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records]


@pytest.fixture
def error_logs() -> Iterator[ErrorLogs]:
    handler = ErrorLogs()
    names = ("", "uvicorn", "uvicorn.error", "colo_fsm")
    for name in names:
        logging.getLogger(name).addHandler(handler)
    try:
        yield handler
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(handler)


wait_until = partial(waits.wait_until, timeout_s=15.0)  # this file's bound


def open_request(port: int, path: str, body: dict[str, Any], *, body_bytes: int | None = None) -> socket.socket:
    """A POST on a fresh connection, kept alive; with ``body_bytes`` only that many bytes of the body are sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(post_bytes(path, body, close=False, partial=body_bytes))
    return sock


def leave(sock: socket.socket, how: str) -> None:
    """Close the connection: ``"close"`` (FIN) or ``"reset"`` (RST, SO_LINGER 0)."""
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def health(gated: Any) -> dict[str, Any]:
    return dict(httpx.get(gated.server_base_urls()[0].removesuffix("/v1") + "/health", timeout=30).json())


def server_slots(gated: Any) -> dict[str, int]:
    """The engine's queued/running/parked HTTP requests, as ``/health`` shows them."""
    engine = health(gated).get("engine_requests")
    assert engine is not None, "/health does not show the engine's slot counts"
    return dict(engine["server"])


def client_at(gated: Any, stage: str) -> int:
    return int(health(gated)["responses"].get("client_by_stage", {}).get(stage, 0))


def no_server_error(gated: Any, error_logs: ErrorLogs) -> None:
    h = health(gated)
    assert h["responses"].get("error", h["responses"].get("errors")) == 0, h["responses"]
    assert h["requests"]["failed"] == 0 and h["requests"]["ended_twice"] == 0, h["requests"]
    assert error_logs.lines() == [], error_logs.lines()


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_client_gone_mid_upload_is_a_client_outcome(how: str, error_logs: ErrorLogs) -> None:
    gated, _ = serve_fake()  # upload_timeout_s 30 s: the client leaves long before
    ctx = gated.server.app.state.ctx
    try:
        sock = open_request(gated.server.port, "/v1/completions", {"prompt": "123>", "max_tokens": 4}, body_bytes=10)
        wait_until(lambda: ctx.stages.now()["upload"] == 1, "the server to be reading the body")
        leave(sock, how)
        wait_until(lambda: client_at(gated, "upload") == 1, "a client gone during upload to be counted")
        assert ctx.stages.now()["upload"] == 0
        no_server_error(gated, error_logs)
    finally:
        gated.shutdown()


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_client_gone_while_queued_for_the_budget_leaves_at_once(how: str, error_logs: ErrorLogs) -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(
        eng, settings=ServerSettings(max_inflight_tokens=50, max_request_share=0.5), request_timeout_s=60.0
    )
    ctx = gated.server.app.state.ctx
    body = {"prompt": "1234>", "max_tokens": 20}  # 25 tokens: two fill the budget of 50
    try:
        eng.suspend()  # the first two requests stay in the engine, holding 50 tokens
        holders = [open_request(gated.server.port, "/v1/completions", body) for _ in range(2)]
        wait_until(lambda: ctx.budget.held == 50, "two requests to hold the whole budget")
        third = open_request(gated.server.port, "/v1/completions", body)
        wait_until(lambda: ctx.budget.waiting == 1, "the third request to wait for the budget")
        leave(third, how)
        # counted and out of the queue long before request_timeout_s (60 s): it never becomes a 429
        wait_until(lambda: client_at(gated, "queue") == 1, "a client gone while queued to be counted")
        assert ctx.budget.waiting == 0 and ctx.budget.held == 50
        assert health(gated)["responses"]["busy"] == 0
        eng.resume()
        for sock in holders:
            sock.settimeout(30)
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
            sock.close()
        wait_until(lambda: ctx.budget.held == 0, "the holders' tokens to come back")
        no_server_error(gated, error_logs)
    finally:
        gated.shutdown()


def test_a_client_gone_while_waiting_for_a_suspended_engine_leaves_at_once(error_logs: ErrorLogs) -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(eng, request_timeout_s=60.0)
    ctx = gated.server.app.state.ctx
    try:
        gated.suspend()  # a handoff: the gate is closed
        sock = open_request(gated.server.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "1"}]})
        wait_until(lambda: gated.gate.waiting == 1, "the request to wait at the closed gate")
        leave(sock, "close")
        wait_until(lambda: client_at(gated, "queue") == 1, "a client gone at the gate to be counted")
        wait_until(lambda: gated.gate.waiting == 0, "the request to leave the gate")
        assert ctx.budget.held == 0 and eng.submitted == []  # never handed to the engine
        assert health(gated)["responses"]["suspended"] == 0
        gated.resume()
        no_server_error(gated, error_logs)
    finally:
        gated.shutdown()


@pytest.mark.parametrize("how", ["close", "reset", "client-timeout"])
def test_a_client_gone_during_generation_frees_its_slot(how: str, error_logs: ErrorLogs) -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(eng, request_timeout_s=60.0)
    ctx = gated.server.app.state.ctx
    body = {"prompt": "1234>", "max_tokens": 20, "n": 2}
    try:
        eng.suspend()  # parked in the engine until the resume
        if how == "client-timeout":  # the client's own timeout ends the exchange
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(gated.server_base_urls()[0] + "/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
        else:
            sock = open_request(gated.server.port, "/v1/completions", body)
            wait_until(lambda: ctx.ledger.open_requests == 1, "the request to be in the engine")
            assert server_slots(gated)["parked"] == 2
            leave(sock, how)
        wait_until(lambda: client_at(gated, "generation") == 1, "a client gone during generation to be counted")
        assert ctx.ledger.counters()["aborted"] == 1
        eng.resume()
        wait_until(lambda: len(eng.cancelled) == 2, "both choices to be cancelled in the engine")
        slots = server_slots(gated)
        assert slots == {"queued": 0, "running": 0, "parked": 0}, slots  # the slots came back
        assert ctx.budget.held == 0
        no_server_error(gated, error_logs)
    finally:
        gated.shutdown()


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_client_gone_mid_stream_is_a_client_outcome(how: str, error_logs: ErrorLogs) -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(eng, request_timeout_s=60.0)
    ctx = gated.server.app.state.ctx
    try:
        eng.suspend()  # the stream's request is parked: the client leaves between two chunks
        body = {"messages": [{"role": "user", "content": "123"}], "max_tokens": 20, "stream": True}
        sock = open_request(gated.server.port, "/v1/chat/completions", body)
        sock.settimeout(30)
        assert sock.recv(12).startswith(b"HTTP/1.1 200")
        wait_until(lambda: ctx.stages.now()["stream"] == 1, "the stream to be sent")
        leave(sock, how)
        wait_until(lambda: client_at(gated, "stream") == 1, "a client gone mid-stream to be counted")
        eng.resume()
        wait_until(lambda: len(eng.cancelled) == 1, "the stream's request to be cancelled in the engine")
        assert server_slots(gated) == {"queued": 0, "running": 0, "parked": 0}
        assert ctx.ledger.counters()["aborted"] == 1 and ctx.budget.held == 0
        no_server_error(gated, error_logs)
    finally:
        gated.shutdown()
