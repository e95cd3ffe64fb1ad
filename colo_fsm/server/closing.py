"""A server that stops without resetting a client's connection.

HTTP/1.1 keeps a connection open between requests. If the server closes it at the moment the client sends its
next request on it, the client reads a reset (or an empty answer) instead of a response, and cannot tell
whether the request ran. A connection still in the listening socket's backlog when that socket closes is reset
too. :class:`DrainingServer` orders its exit so that neither happens to a client that keeps sending:

1. it stops accepting (a new connection is refused, which a client reads as such). Until then responses kept
   connections alive (a teardown's 503s too), so clients were reusing them and few new ones were in the backlog;
2. it drains: every response from now on says ``Connection: close`` (:class:`CloseWhenDraining`), so a client
   answered on a kept connection does not send on it again, and its next connection is refused;
3. once every connection has closed, or after ``drain_s``, uvicorn's own shutdown closes what is left.

Only a connection that stayed idle through the whole drain and sends at its very end can still meet a closed
connection: HTTP/1.1's own race, which a drain longer than the client's pause avoids.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

CLOSE_HEADER = (b"connection", b"close")


class CloseWhenDraining:
    """ASGI middleware: adds ``Connection: close`` to every HTTP response started while ``draining()`` is true."""

    def __init__(self, app: Any, draining: Callable[[], bool]) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Any) -> None:
            if message.get("type") == "http.response.start" and self.draining():
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, CLOSE_HEADER]}
            await send(message)

        await self.app(scope, receive, send_closing)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit stops accepting, then drains open connections (up to ``drain_s``).

    :attr:`draining` is true from the moment no new connection is accepted (feed it to
    :class:`CloseWhenDraining`); ``on_drain`` (a test hook) is called in the server's loop right then;
    :attr:`connections_open` after the exit says how many the drain had to leave to uvicorn's shutdown.
    """

    def __init__(self, config: uvicorn.Config, drain_s: float, on_drain: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.drain_s = float(drain_s)
        self.on_drain = on_drain
        self.draining = False
        self.connections_open = 0

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting, drain (``Connection: close`` on every response, up to ``drain_s`` for the open
        connections to close), then uvicorn's shutdown."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        self.draining = True
        if self.on_drain is not None:
            self.on_drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_s
        while self.server_state.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.connections_open = len(self.server_state.connections)
        await super().shutdown(sockets=None)


__all__ = ["CLOSE_HEADER", "CloseWhenDraining", "DrainingServer"]
