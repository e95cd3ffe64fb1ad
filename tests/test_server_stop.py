"""Stopping the server never resets a client's connection. While the teardown answers 503 "shutting down" the
connection stays alive (clients keep reusing theirs instead of opening new ones that could sit in the backlog when
the listening socket closes); once the server stops accepting, a request on a kept connection is still answered,
with ``Connection: close``, and a new connection is refused. The interleaving is forced: the client sends only
once the server has stopped accepting (the drain hook fired)."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
from _server_fake import serve_fake

from colo_fsm.errors import ConfigError
from colo_fsm.server import OpenAIServer
from colo_fsm.server.closing import CLOSE_HEADER
from tests.support.chaos import post_bytes


def send_keep_alive(sock: socket.socket, body: dict[str, Any]) -> None:
    """One POST /v1/completions on ``sock`` that leaves the connection open (HTTP/1.1's default)."""
    sock.sendall(post_bytes("/v1/completions", body, close=False))


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response (status, lower-cased headers, body), by its Content-Length; raises if the server
    closed or reset the connection before it was whole."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the server closed the connection before a response (got {buf!r})")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection inside a response")
        body += chunk
    return int(lines[0].split()[1]), headers, body


def test_a_request_on_a_kept_connection_during_the_stop_is_answered_and_new_connections_are_refused() -> None:
    gated, _ = serve_fake(shutdown_grace_s=0.0)
    server = gated.server
    server.drain_s = 30.0  # the drain ends when our connection closes, long before this
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    send_keep_alive(sock, {"prompt": "12>", "max_tokens": 4, "temperature": 0})
    status, headers, _ = read_response(sock)
    assert status == 200 and headers.get("connection", "").lower() != "close"  # kept alive while running

    gated.stopping = True  # what GatedEngine.shutdown() does first: requests get 503 "shutting down" from now on
    gated.gate.retire()
    send_keep_alive(sock, {"prompt": "12>", "max_tokens": 4})
    status, headers, body = read_response(sock)
    assert status == 503 and json.loads(body)["error"]["code"] == "shutting_down"
    assert headers.get("connection", "").lower() != "close"  # still kept: the client reuses it, no new connection

    draining = threading.Event()
    release = threading.Event()

    def on_drain() -> None:  # runs in the server's loop once it no longer accepts; the client sends meanwhile
        draining.set()

    server._server.on_drain = on_drain
    stopper = threading.Thread(target=lambda: (gated.shutdown(), release.set()), daemon=True)
    stopper.start()
    assert draining.wait(30), "the server never began its drain"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()

    send_keep_alive(sock, {"prompt": "12>", "max_tokens": 4})
    status, headers, body = read_response(sock)  # an answer, not a reset
    assert status == 503 and json.loads(body)["error"]["code"] == "shutting_down"
    assert headers["connection"].lower() == CLOSE_HEADER[1].decode()
    assert sock.recv(1) == b""  # then the server closes it, cleanly
    sock.close()
    assert release.wait(30)
    stopper.join(30)
    assert server._server.connections_open == 0  # the drain did not have to cut anyone off


def test_drain_s_is_checked() -> None:
    with pytest.raises(ConfigError, match="drain_s"):
        OpenAIServer(object(), drain_s=-1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="drain_s"):
        OpenAIServer(object(), drain_s=True)  # type: ignore[arg-type]
