"""The demo's live progress display: one rewritten status line on a TTY, plain lines otherwise.

:func:`follow` subscribes a display to a lifecycle's trace, so the shown state changes on every transition
(Draining, Training, Checkpointing, Validating, ...), not only after a whole step.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from colo_fsm.machine.trace import TraceRecord
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec


class ProgressDisplay:
    """Shows state, step, weight version, reward, consumed samples and samples/s, and (with ``requests``, a
    callable returning the engine's ``RequestCounts``) the requests running and queued in the engine and how
    many it kept parked through the latest handoff.

    On a TTY the status line is rewritten in place (``\\r``); otherwise a plain line is printed every
    ``every`` steps. Events (validation, checkpoint, start-up facts) always get their own line.
    :meth:`transition` (called for every lifecycle transition, see :func:`follow`) refreshes the state shown,
    throttled: on a TTY at most one redraw per ``tty_interval_s`` except on entering a resting state; in plain
    mode at most one line per ``plain_interval_s``, so piped output stays a readable log.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        stream: TextIO | None = None,
        every: int = 10,
        tty: bool | None = None,
        tty_interval_s: float = 0.2,
        plain_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        requests: Callable[[], Any] | None = None,
    ) -> None:
        self.stream = stream or sys.stdout
        self._requests = requests
        self._handoff_open = False
        self._handoff_parked = 0
        self.total = total_steps
        self.every = max(1, every)
        self.tty = self.stream.isatty() if tty is None else tty
        self.tty_interval_s = tty_interval_s
        self.plain_interval_s = plain_interval_s
        self._clock = clock
        self.t0 = clock()
        self._open = False
        self._lock = threading.RLock()
        self._last_draw = float("-inf")
        self._shown: dict[str, Any] = {
            "state": "",
            "step": 0,
            "weight_version": 0,
            "reward": 0.0,
            "consumed": 0,
            "samples_per_s": 0.0,
        }
        if requests is not None:
            self._shown.update(running=0, queued=0, parked=0)

    def status_line(
        self,
        *,
        state: str,
        step: int,
        weight_version: int,
        reward: float,
        consumed: int,
        samples_per_s: float,
        running: int | None = None,
        queued: int | None = None,
        parked: int | None = None,
    ) -> str:
        """The status text (also what the plain-line mode prints); request counts when known."""
        line = (
            f"[{self._clock() - self.t0:6.1f}s] {state:<13} step {step:>4}/{self.total} "
            f"wv {weight_version:>4}  reward {reward:6.3f}  consumed {consumed:>7}  {samples_per_s:7.1f} samples/s"
        )
        if parked is not None:
            line += f"  requests {running or 0:>3} running {queued or 0:>3} queued {parked:>3} parked"
        return line

    def _sample_requests(self, resting: bool) -> None:
        """Read the engine's request counts; ``parked`` shows the most parked during the latest handoff."""
        if self._requests is None:
            return
        try:
            c = self._requests()
        except Exception:  # an engine not up yet, or torn down: keep the last counts
            return
        self._shown.update(running=int(c.running), queued=int(c.queued))
        if resting:
            self._handoff_open = False
        else:
            if not self._handoff_open:
                self._handoff_open, self._handoff_parked = True, 0
            self._handoff_parked = max(self._handoff_parked, int(c.parked))
            self._shown["parked"] = self._handoff_parked

    def _write_status(self, newline: bool) -> None:
        line = self.status_line(**self._shown)
        if newline:
            if self._open:
                self.stream.write("\r\x1b[2K")
                self._open = False
            self.stream.write(line + "\n")
        else:
            self.stream.write("\r\x1b[2K" + line)
            self._open = True
        self.stream.flush()
        self._last_draw = self._clock()

    def update(
        self, *, state: str, step: int, weight_version: int, reward: float, consumed: int, samples_per_s: float
    ) -> None:
        """Show the current status (rewritten on a TTY, every ``every`` steps otherwise)."""
        with self._lock:
            self._shown.update(
                state=state,
                step=step,
                weight_version=weight_version,
                reward=reward,
                consumed=consumed,
                samples_per_s=samples_per_s,
            )
            self._sample_requests(resting=True)
            if self.tty:
                self._write_status(newline=False)
            elif step % self.every == 0 or step == self.total:
                self._write_status(newline=True)

    def transition(self, state: str, *, step: int, weight_version: int, resting: bool = False) -> None:
        """The lifecycle entered ``state``: refresh the status (throttled, see the class docstring)."""
        with self._lock:
            self._shown.update(state=state, step=step, weight_version=weight_version)
            self._sample_requests(resting)
            since = self._clock() - self._last_draw
            if self.tty:
                if resting or since >= self.tty_interval_s:
                    self._write_status(newline=False)
            elif since >= self.plain_interval_s:
                self._write_status(newline=True)

    def event(self, text: str) -> None:
        """Print one event line (keeps the TTY status line below it)."""
        with self._lock:
            if self._open:
                self.stream.write("\r\x1b[2K")
                self._open = False
            self.stream.write(f"[{self._clock() - self.t0:6.1f}s] {text}\n")
            self.stream.flush()

    def close(self) -> None:
        """End the status line."""
        with self._lock:
            if self._open:
                self.stream.write("\n")
                self._open = False
            self.stream.flush()


def follow(display: ProgressDisplay, trace: Any, spec: LifecycleSpec = LIFECYCLE) -> Callable[[TraceRecord], None]:
    """Subscribe ``display`` to ``trace`` (a lifecycle's :class:`~colo_fsm.machine.trace.Trace`): every
    transition refreshes the shown state; entering a resting state (per ``spec``) always redraws on a TTY.
    Returns the subscribed callback."""

    def on_record(record: TraceRecord) -> None:
        display.transition(
            record.dest,
            step=record.step,
            weight_version=record.weight_version,
            resting=spec.state(record.dest).resting,
        )

    trace.subscribe(on_record)
    return on_record


__all__ = ["ProgressDisplay", "follow"]
