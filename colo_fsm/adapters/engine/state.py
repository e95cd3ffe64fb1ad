"""The engine loop's shared state: what every part of :class:`~colo_fsm.adapters.engine.ContinuousBatcher` reads.

The loop is one class assembled from parts with one job each (admission, stepping, cancellation, suspension,
the tensor-parallel lockstep); :class:`EngineState` declares the fields they share, all guarded by ``_cond``
(the engine thread alone touches the backend), and the few helpers every part uses.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.adapters.engine.options import InflightPolicy, LogprobsMode
from colo_fsm.adapters.engine.protocol import StepBackend
from colo_fsm.adapters.engine.results import EngineRequest, InflightStats, TokenCompletion, completion_of
from colo_fsm.adapters.lockstep import Lockstep


@dataclass
class Command:
    """A control call waiting for the engine thread; ``done`` resolves when it was carried out."""

    kind: str  # "suspend" | "resume" | "shutdown"
    done: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    drain: bool = False


class EngineState:
    """Fields shared by the parts of the engine loop (set in ``ContinuousBatcher.__init__``)."""

    _factory: Callable[[], StepBackend]
    _lockstep: Lockstep | None
    _lockstep_wait_s: float
    _weight_version: Callable[[], int]
    max_active_requests: int
    server_slots: int  # Priority.SERVER requests active at once, at most (the server's share of the engine)
    inflight: InflightPolicy
    max_top_logprobs: int
    logprobs_mode: LogprobsMode  # the default of submit(logprobs_mode=None)
    max_sequence_length: int | None
    _detokenize: Callable[[Sequence[int]], str]
    _device_context: Callable[[], contextlib.AbstractContextManager[Any]]
    _name: str
    _cond: threading.Condition
    _queue: list[EngineRequest]  # waiting for admission (kept sorted by (priority, seq))
    _active: dict[int, EngineRequest]  # admitted, in the backend (running, or parked while suspended)
    _pending_aborts: list[int]  # admitted requests aborted by a caller: backend.abort at the next awake boundary
    _commands: deque[Command]
    _draining: bool  # a drain-mode suspend closed admission
    _awake: bool
    _stopping: bool
    _stopped: bool
    _decode_in_flight: bool
    _thread: threading.Thread | None
    backend: StepBackend | None
    steps: int
    steps_while_suspended: int
    completed: int
    timings: list[tuple[str, float]]
    idle_waits: int
    idle: bool
    reprefills: int
    reprefill_tokens: int
    resubmissions: int
    discarded_tokens: int

    def inflight_stats(self) -> InflightStats:
        """What ``inflight="abort"`` cost so far: requests ended at a suspend, the KV tokens they discarded, and
        the re-admissions that prefilled prompt + tokens so far again."""
        with self._cond:
            return InflightStats(self.resubmissions, self.discarded_tokens, self.reprefills, self.reprefill_tokens)

    @property
    def stopped(self) -> bool:
        """True once :meth:`shutdown` began: new requests are refused."""
        return self._stopping or self._stopped

    def _can_step_locked(self) -> bool:
        if not self._awake or self._stopping:
            return False
        return bool(self._active) or (bool(self._queue) and not self._draining)

    def _sleep_locked(self, timeout: float | None = None) -> bool:
        """Wait for work with nothing to do (counted, so a test can tell the loop has seen a change); False
        when ``timeout`` passed without a notification."""
        self.idle_waits += 1
        self.idle = True
        self._cond.notify_all()
        woken = self._cond.wait(timeout)
        self.idle = False
        return woken

    def _mark_done_locked(self, req: EngineRequest, reason: str) -> None:
        req.state = "done"
        req.finish_reason = reason
        req.completion = self._completion_of(req, reason)
        self.completed += 1

    def _completion_of(self, req: EngineRequest, reason: str) -> TokenCompletion:
        return completion_of(req, reason, self._detokenize)


__all__ = ["Command", "EngineState"]
