"""Cancellation, safe in every state of the engine loop.

A caller's cancel (``handle.cancel()``, a cancelled future, a cancelled awaiting task) answers it at once with
finish "abort" and frees its slot for admission. A queued request just leaves the queue. An admitted request
leaves the backend at the next step boundary while the engine is awake; while it is suspended (parked, or
inside the suspend or resume call) the removal is recorded and applied after the resume, before the first decode
step: a suspended backend never sees an abort, and never a decode step.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable

from colo_fsm.adapters.engine.results import EngineRequest, TokenCompletion, resolve
from colo_fsm.adapters.engine.state import EngineState


class Cancellation(EngineState):
    """The engine loop's cancel path (a part of :class:`~colo_fsm.adapters.engine.ContinuousBatcher`)."""

    @property
    def aborts_pending(self) -> int:
        """Admitted requests already answered "abort" whose removal from the backend waits for a step boundary
        (while suspended: for the resume)."""
        with self._cond:
            return len(self._pending_aborts)

    def abort(self, request_id: int) -> bool:
        """Abort one request (queued, running or parked): its future resolves "abort" now; False if it was done.

        Safe in every state: a queued request just leaves the queue; an admitted one leaves the backend at the
        next step boundary while the engine is awake, and while it is suspended the removal is recorded
        (:attr:`aborts_pending`) and applied after the resume, before the first decode step. The slot is free
        for admission at once.
        """
        with self._cond:
            req = self._find_locked(request_id)
            if req is None or req.detached:
                return False
            if self._lockstep is not None and not self._lockstep.leader:
                # a follower keeps the request in the group's schedule (the leader decides what runs): only the
                # caller is answered now; the row leaves when the leader aborts it or it finishes
                req.detached = True
                done = self._completion_of(req, "abort")
                self._cond.notify_all()
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    req.future.set_result(done) if not req.future.done() else None
                return True
            if req.state == "queued":
                self._queue.remove(req)
                if self._lockstep is not None:  # the leader: the followers drop their queued copy too
                    self._pending_aborts.append(req.backend_id)
            else:
                self._active.pop(req.backend_id, None)
                self._pending_aborts.append(req.backend_id)
            self._mark_done_locked(req, "abort")
            self._cond.notify_all()
        resolve(req)
        return True

    def _on_future_done(self, request_id: int) -> Callable[[concurrent.futures.Future[TokenCompletion]], None]:
        def done(f: concurrent.futures.Future[TokenCompletion]) -> None:
            if f.cancelled():  # the caller cancelled its future: abort the request in the engine
                self.abort(request_id)

        return done

    def _find_locked(self, request_id: int) -> EngineRequest | None:
        req = self._active.get(request_id)
        if req is None or req.request_id != request_id:  # keyed by backend id, which a resubmission changes
            req = next((r for r in self._active.values() if r.request_id == request_id), None)
        if req is None:
            req = next((r for r in self._queue if r.request_id == request_id), None)
        return req if req is not None and req.state != "done" else None

    def _aborts_due_locked(self) -> bool:
        """Aborts to apply now: only while awake (a suspended engine keeps them until the resume)."""
        return bool(self._pending_aborts) and self._awake and not self._stopping

    def _take_aborts_locked(self) -> list[int]:
        """The recorded aborts the backend gets before this iteration's step; none while suspended."""
        if not self._aborts_due_locked():
            return []
        aborts, self._pending_aborts = self._pending_aborts, []
        return aborts


__all__ = ["Cancellation"]
