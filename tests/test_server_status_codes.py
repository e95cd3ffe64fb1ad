"""Status codes that say what happened: 408 for a stalled or too-slow upload (after ``upload_timeout_s``, the
connection closed), 503 with a ``Retry-After`` from the measured handoff length for an engine suspended past the
wait (429 with one from the budget's drain rate is in test_server_admission.py)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest
from _server_fake import FakeEngine, serve_fake

from colo_fsm.server import ServerSettings
from colo_fsm.server.retry import HandoffLengths, clamp_seconds
from tests.support.chaos import read_all, status_of


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def health(gated: Any) -> dict[str, Any]:
    return dict(httpx.get(gated.server_base_urls()[0].removesuffix("/v1") + "/health", timeout=30).json())


@pytest.mark.parametrize("pace", ["stalled", "trickle"])
def test_a_stalled_or_too_slow_upload_gets_408_and_the_connection_closes(pace: str) -> None:
    gated, _ = serve_fake(settings=ServerSettings(upload_timeout_s=0.5))
    try:
        data = json.dumps({"prompt": "1234>", "max_tokens": 4}).encode()
        sock = socket.create_connection(("127.0.0.1", gated.server.port), timeout=30)
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        sock.sendall(head + data[:5])
        if pace == "trickle":  # one byte at a time, never finishing within the timeout
            sock.setblocking(True)
            for b in data[5:-1]:
                try:
                    sock.sendall(bytes([b]))
                except OSError:
                    break  # the server answered and closed
                time.sleep(0.05)
        raw = read_all(sock, 20.0)
        sock.close()
        assert status_of(raw) == 408, f"a stalled upload was not timed out: {raw[:300]!r}"
        assert b"connection: close" in raw.lower() and b"upload_timeout_s=0.5" in raw, raw
        h = health(gated)
        assert h["responses"]["upload_timeout"] == 1 and h["responses"]["client_by_stage"]["upload"] == 1
        assert h["responses"]["error"] == 0 and h["responses"]["bad_request"] == 0, h["responses"]
        # a whole body in time is served as before
        r = httpx.post(gated.server_base_urls()[0] + "/completions", json={"prompt": "12>", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        gated.shutdown()


def test_retry_after_of_a_handoff_is_what_longer_handoffs_had_left() -> None:
    clock = FakeClock()
    h = HandoffLengths(clock=clock)
    assert h.retry_after(1, 60) == 1  # nothing measured: the floor
    for length in (4.0, 8.0, 12.0):
        h.began()
        clock.now += length
        assert h.ended() == pytest.approx(length)
    assert h.count == 3 and h.recent() == [4.0, 8.0, 12.0]
    h.began()
    clock.now += 5.0  # this one has lasted 5 s: handoffs that went past 5 s had 3 and 7 s left
    assert h.remaining(5.0) == pytest.approx(5.0)
    assert h.retry_after(1, 60) == 5
    clock.now += 10.0  # 15 s: longer than any measured: as long again
    assert h.retry_after(1, 60) == 15
    assert h.retry_after(1, 10) == 10  # clamped
    assert clamp_seconds(0.2, 1, 60) == 1 and clamp_seconds(float("inf"), 1, 60) == 60


def test_an_engine_suspended_past_the_wait_gets_503_with_retry_after_from_measured_handoffs() -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(eng, request_timeout_s=0.3)
    url = gated.server_base_urls()[0]
    body = {"prompt": "12>", "max_tokens": 2}
    try:
        for _ in range(3):  # real handoffs: each one measured, closed to reopened
            gated.suspend()
            gated.resume()
        assert gated.gate.handoffs.count == 3
        for length in (20.0, 20.0, 20.0):  # and three long ones, as if training steps of 20 s had run
            gated.gate.handoffs.record(length)
        gated.suspend()
        r = httpx.post(url + "/completions", json=body, timeout=30)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "engine_suspended" and "handoffs here last" in err["message"], err
        retry = int(r.headers["Retry-After"])
        # this handoff has lasted about request_timeout_s; the 20 s ones had about 19.7 s left: 20, 19 or so,
        # never the old constant 1
        assert 10 <= retry <= 20, (
            f"Retry-After {retry} is not from the measured handoffs ({gated.gate.handoffs.recent()})"
        )
        gated.resume()
        assert httpx.post(url + "/completions", json=body, timeout=30).status_code == 200
        h = health(gated)
        assert h["responses"]["suspended"] == 1 and h["responses"]["busy"] == 0, h["responses"]
        assert h["handoffs"]["count"] == 7  # 3 + 1 measured here, 3 recorded by hand
    finally:
        gated.shutdown()
