"""A server that stops without resetting a client's connection.

HTTP/1.1 keeps a connection open between requests. If the server closes it at the moment the client sends its
next request on it, the client reads a reset (or an empty answer) instead of a response, and cannot tell
whether the request ran. Two parts keep that from happening while the server stops:

- :class:`CloseWhenStopping` (ASGI middleware): once a teardown began, every response says
  ``Connection: close``, so a client opens a new connection for its next request instead of reusing this one;
- :class:`DrainingServer` (uvicorn): on exit it first stops accepting (a new connection is refused, which a
  client sees as such), then waits up to ``drain_s`` for the open connections to finish their exchange and
  close; only the ones still open after that are closed by uvicorn's own shutdown.

A client whose connection sat idle through the whole drain and sends at its very end can still meet a closed
connection; that is HTTP/1.1's own race, and a drain longer than the client's pause avoids it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

CLOSE_HEADER = (b"connection", b"close")


class CloseWhenStopping:
    """ASGI middleware: adds ``Connection: close`` to every HTTP response started once ``stopping()`` is true."""

    def __init__(self, app: Any, stopping: Callable[[], bool]) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Any) -> None:
            if message.get("type") == "http.response.start" and self.stopping():
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, CLOSE_HEADER]}
            await send(message)

        await self.app(scope, receive, send_closing)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit stops accepting first, then gives open connections ``drain_s`` to close.

    ``on_drain`` (a test hook) is called in the server's loop once no new connection is accepted, before the
    wait; ``connections_open`` after the exit says how many the drain had to close itself.
    """

    def __init__(self, config: uvicorn.Config, drain_s: float, on_drain: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.drain_s = float(drain_s)
        self.on_drain = on_drain
        self.connections_open = 0

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting, wait (up to ``drain_s``) for the open connections to close, then uvicorn's shutdown."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        if self.on_drain is not None:
            self.on_drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_s
        while self.server_state.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.connections_open = len(self.server_state.connections)
        await super().shutdown(sockets=None)


__all__ = ["CLOSE_HEADER", "CloseWhenStopping", "DrainingServer"]
