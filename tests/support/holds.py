"""A request held in flight until the test's suspend is queued: some request spans that suspend, whatever the
machine's load (an order, not a timing). Used by the server tests over the real engine."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

WAIT = 60.0  # seconds the held request waits for the suspend before the hold records its failure


class FirstRequestHold:
    """Holds the first request that may make two tokens or more at its first token, until a control call is queued
    for the engine thread. While a request decodes no resume can be pending (a resume returns once applied, and a
    suspended engine makes no token), so that call is the test's suspend: the request is parked by it."""

    def __init__(self, wait_for_control: Callable[[float], bool]) -> None:
        self._wait_for_control = wait_for_control
        self._lock = threading.Lock()
        self.index: int | None = None  # which of the submitted requests is held
        self.failed: str | None = None

    def wrap(self, kw: dict[str, Any], index: int) -> None:
        """Wraps ``kw["on_token"]`` when the request about to be submitted (the ``index``-th) is the one to hold."""
        with self._lock:
            if self.index is not None or kw.get("max_tokens", 0) < 2:
                return
            self.index = index
        on_token, seen = kw.get("on_token"), [0]

        def held(*args: Any) -> bool | None:
            keep = on_token(*args) if on_token is not None else None
            seen[0] += 1
            if seen[0] == 1 and keep is not False and not self._wait_for_control(WAIT):
                self.failed = "no suspend came while the request was held at its first token"
            return keep

        kw["on_token"] = held
