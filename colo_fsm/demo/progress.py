"""The demo's live progress display: one rewritten status line on a TTY, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressDisplay:
    """Shows state, step, weight version, reward, consumed samples and samples/s.

    On a TTY the status line is rewritten in place (``\\r``); otherwise a plain line is printed every
    ``every`` steps. Events (validation, checkpoint, start-up facts) always get their own line.
    """

    def __init__(
        self, total_steps: int, *, stream: TextIO | None = None, every: int = 10, tty: bool | None = None
    ) -> None:
        self.stream = stream or sys.stdout
        self.total = total_steps
        self.every = max(1, every)
        self.tty = self.stream.isatty() if tty is None else tty
        self.t0 = time.monotonic()
        self._open = False

    def status_line(
        self, *, state: str, step: int, weight_version: int, reward: float, consumed: int, samples_per_s: float
    ) -> str:
        """The status text (also what the plain-line mode prints)."""
        return (
            f"[{time.monotonic() - self.t0:6.1f}s] {state:<13} step {step:>4}/{self.total} "
            f"wv {weight_version:>4}  reward {reward:6.3f}  consumed {consumed:>7}  {samples_per_s:7.1f} samples/s"
        )

    def update(
        self, *, state: str, step: int, weight_version: int, reward: float, consumed: int, samples_per_s: float
    ) -> None:
        """Show the current status (rewritten on a TTY, every ``every`` steps otherwise)."""
        line = self.status_line(
            state=state,
            step=step,
            weight_version=weight_version,
            reward=reward,
            consumed=consumed,
            samples_per_s=samples_per_s,
        )
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self._open = True
        elif step % self.every == 0 or step == self.total:
            self.stream.write(line + "\n")
        self.stream.flush()

    def event(self, text: str) -> None:
        """Print one event line (keeps the TTY status line below it)."""
        if self._open:
            self.stream.write("\r\x1b[2K")
            self._open = False
        self.stream.write(f"[{time.monotonic() - self.t0:6.1f}s] {text}\n")
        self.stream.flush()

    def close(self) -> None:
        """End the status line."""
        if self._open:
            self.stream.write("\n")
            self._open = False
        self.stream.flush()


__all__ = ["ProgressDisplay"]
