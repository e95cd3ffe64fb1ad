"""The per-rank engine loop: one engine thread steps every active request of a :class:`StepBackend` together.

:class:`ContinuousBatcher` is assembled from parts with one job each: admission (queue, priorities),
stepping (the decode step and token intake), cancellation, suspension (park / drain / shutdown commands) and
the tensor-parallel lockstep iteration. This module holds the thread and the plain iteration that ties them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from colo_fsm.adapters.engine.lockstep_loop import LockstepIteration
from colo_fsm.adapters.engine.options import (
    DEFAULT_MAX_TOP_LOGPROBS,
    DEFAULT_SERVER_SHARE,
    InflightPolicy,
    LogprobsMode,
    check_share,
    parse_inflight,
    parse_logprobs_mode,
    positive_int,
    share_slots,
)
from colo_fsm.adapters.engine.protocol import StepBackend
from colo_fsm.adapters.engine.results import EngineRequest
from colo_fsm.adapters.engine.state import Command
from colo_fsm.adapters.lockstep import FEED_ID_BASE, Lockstep
from colo_fsm.errors import ConfigError, LifecycleError
from colo_fsm.log import get_logger

log = get_logger(__name__)


class ContinuousBatcher(LockstepIteration):
    """The per-rank engine loop over a :class:`StepBackend` (built on the engine thread by ``backend_factory``).

    ``weight_version`` is read at every step and stamped on that step's tokens. ``device_context`` (a callable
    returning a context manager) wraps the engine thread, e.g. to make this rank's GPU current there.
    ``lockstep`` (tensor-parallel ranks) makes every rank of the group follow the leader's plan of each
    iteration (:mod:`colo_fsm.adapters.lockstep`); submissions and control calls must then be SPMD.
    ``max_top_logprobs`` bounds the alternatives per token one request may ask for. ``server_share`` (in (0, 1])
    bounds the share of ``max_active_requests`` that :attr:`Priority.SERVER` requests may hold at once (see
    :mod:`colo_fsm.adapters.engine.admission`); 1 lifts the cap. ``logprobs_mode`` ("raw" or "processed") is
    the default distribution of every request's returned log-probs (``submit(logprobs_mode=...)`` overrides it).
    """

    admits_by_turn = True  # submit(turn=...): within a priority, requests are admitted by turn, then arrival

    def __init__(
        self,
        backend_factory: Callable[[], StepBackend],
        *,
        weight_version: Callable[[], int] | None = None,
        max_active_requests: int = 64,
        inflight: InflightPolicy | str = InflightPolicy.PARK,
        max_sequence_length: int | None = None,
        detokenize: Callable[[Sequence[int]], str] | None = None,
        device_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        name: str = "colo-fsm-engine",
        lockstep: Lockstep | None = None,
        lockstep_wait_s: float = 300.0,
        max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS,
        server_share: float = DEFAULT_SERVER_SHARE,
        logprobs_mode: LogprobsMode | str = LogprobsMode.RAW,
    ) -> None:
        self._factory = backend_factory
        self._lockstep = lockstep  # TP > 1: the group's leader plans every iteration (colo_fsm.adapters.lockstep)
        self._lockstep_wait_s = float(lockstep_wait_s)
        self._weight_version = weight_version or (lambda: 0)
        self.max_active_requests = positive_int("max_active_requests", max_active_requests)
        self.inflight = parse_inflight(inflight)
        self.server_share = check_share(server_share)
        self.logprobs_mode = parse_logprobs_mode(logprobs_mode)
        self.server_slots = share_slots(self.server_share, self.max_active_requests)
        if isinstance(max_top_logprobs, bool) or not isinstance(max_top_logprobs, int) or max_top_logprobs < 0:
            raise ConfigError("max_top_logprobs", max_top_logprobs, "a non-negative integer")
        self.max_top_logprobs = max_top_logprobs
        self.max_sequence_length = max_sequence_length
        self._detokenize = detokenize or (lambda ids: "")
        self._device_context = device_context or contextlib.nullcontext
        self._name = name
        self._cond = threading.Condition(threading.RLock())
        self._ids = itertools.count()
        self._feed_ids = itertools.count(FEED_ID_BASE)  # leader-only requests (feed=True): ids of their own
        self._seq = itertools.count()
        self._queue: list[EngineRequest] = []  # waiting for admission (kept sorted by (priority, seq))
        self._active: dict[int, EngineRequest] = {}  # admitted, in the backend (running, or parked while suspended)
        self._pending_aborts: list[int] = []  # admitted requests aborted by a caller: backend.abort at next boundary
        self._commands: deque[Command] = deque()
        self._draining = False  # a drain-mode suspend closed admission
        self._awake = False
        self._stopping = False
        self._stopped = False
        self._decode_in_flight = False
        self._thread: threading.Thread | None = None
        self.backend: StepBackend | None = None
        self.steps = 0  # decode steps run so far
        self.steps_while_suspended = 0  # must stay 0: a decode step never runs while suspended
        self.completed = 0  # requests resolved (any finish reason)
        self.timings: list[tuple[str, float]] = []  # ("suspend"|"resume", backend seconds)
        self.idle_waits = 0  # times the engine thread went to sleep with nothing to do (tests wait on it)
        self.idle = False  # True while the engine thread sleeps with nothing to do
        self.reprefills = 0  # requests re-admitted after an inflight="abort" suspend ended them
        self.reprefill_tokens = 0  # prompt + generated tokens those re-admissions prefilled again
        self.resubmissions = 0  # requests an inflight="abort" suspend ended (each resubmitted)
        self.discarded_tokens = 0  # KV tokens (prompt + generated) those ended attempts held

    # ------------------------------------------------------------------ lifecycle of the loop
    def start(self) -> None:
        """Start the engine thread, build the backend on it and wait for the build (its error is re-raised)."""
        if self._thread is not None:
            raise LifecycleError("ContinuousBatcher.start called twice")
        built: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(built,), name=self._name, daemon=True)
        self._thread.start()
        built.result()

    @property
    def awake(self) -> bool:
        """True while requests are being decoded (not suspended, not shut down)."""
        return self._awake and not self._stopped

    @property
    def decode_in_flight(self) -> bool:
        """True only while a decode step runs on the engine thread."""
        return self._decode_in_flight

    def _run(self, built: concurrent.futures.Future[None]) -> None:
        with self._device_context():
            try:
                self.backend = self._factory()
            except BaseException as exc:  # the builder's error goes to start()'s caller
                self._stopped = True
                built.set_exception(exc)
                return
            self._awake = True
            built.set_result(None)
            try:
                while self._loop_once():
                    pass
            except BaseException as exc:  # never leave callers waiting forever on a dead loop
                log.exception("engine loop died")
                self._fail_everything(exc)
                with contextlib.suppress(Exception):
                    self.backend.shutdown()

    def _loop_once(self) -> bool:
        """One iteration: a control command, or admissions plus one decode step. False when the loop ends."""
        if self._lockstep is not None:
            return self._loop_once_lockstep(self._lockstep)
        with self._cond:
            while True:
                cmd = self._ready_command_locked()
                if cmd is not None or self._aborts_due_locked() or self._can_step_locked():
                    break
                self._sleep_locked()
            aborts = self._take_aborts_locked()
            admit = [] if cmd is not None else list(self._admissible_locked())
            for req in admit:
                self._admit_locked(req)
        backend = self.backend
        assert backend is not None
        for rid in aborts:  # only while awake: a suspended engine keeps them until the resume
            backend.abort(rid)
        if cmd is not None:
            return self._execute(cmd, backend)
        self._add_to_backend(backend, admit)
        if self._active and self._awake and not self._stopping:  # never a decode step on a suspended engine
            self._step(backend)
        return True


__all__ = ["ContinuousBatcher"]
