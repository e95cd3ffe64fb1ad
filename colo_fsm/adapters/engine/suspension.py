"""Suspension: the control commands (suspend, resume, shutdown) and what a suspend does with requests in flight.

A control call queues a :class:`~colo_fsm.adapters.engine.state.Command` and waits for the engine thread to
carry it out at a step boundary, so no decode step is ever in flight during a suspend, resume or shutdown.
``inflight="park"`` suspends at the next boundary with the active requests kept in the backend;
``inflight="drain"`` first closes admission and steps the admitted requests to their end;
``inflight="abort"`` (the peers' colocated-async way) ends the active requests in the backend at the boundary and
queues each again as prompt + the tokens it already has, with the rest of its ``max_tokens``: after the resume
it is re-prefilled under the new weights and continues. Its caller sees one completion with every token, each
stamped with the weight version it was generated under (the oldest counts for its age).
"""

from __future__ import annotations

import dataclasses
import threading

from colo_fsm.adapters.engine.options import InflightPolicy, parse_inflight, request_seed
from colo_fsm.adapters.engine.protocol import StepBackend
from colo_fsm.adapters.engine.results import queue_order, resolve
from colo_fsm.adapters.engine.state import Command, EngineState
from colo_fsm.errors import EngineStopped, LifecycleError
from colo_fsm.log import get_logger

log = get_logger(__name__)


class Suspension(EngineState):
    """The engine loop's control commands (a part of :class:`~colo_fsm.adapters.engine.ContinuousBatcher`)."""

    def suspend(self) -> None:
        """Stop decoding at a step boundary, then suspend: park (requests kept in the backend), drain (after the
        admitted requests finish) or abort (requests ended in the backend, resubmitted after the resume).

        On return no decode step is in flight and none starts until :meth:`resume`.
        """
        self._command("suspend", drain=self.inflight is InflightPolicy.DRAIN)

    def resume(self) -> None:
        """Resume the backend; parked requests continue and queued ones are admitted."""
        self._command("resume")

    def set_inflight(self, inflight: InflightPolicy | str) -> None:
        """Change what the next suspends do with admitted requests ("park", "drain", "abort"; aliases "keep",
        "wait"). Only while nothing is queued, admitted or waiting for the engine thread (a policy switched under
        a request would change the promise it was admitted with); under a tensor-parallel lockstep every rank of
        the group must make the same call at the same point. Raises :class:`LifecycleError` otherwise."""
        policy = parse_inflight(inflight)
        with self._cond:
            busy = len(self._queue) + len(self._active)
            if busy or self._commands:
                raise LifecycleError(
                    f"engine set_inflight({policy.value!r}) with {busy} request(s) queued or admitted and "
                    f"{len(self._commands)} control call(s) pending: switch the policy while the engine is idle"
                )
            self.inflight = policy

    def shutdown(self) -> None:
        """Abort everything left (futures resolve "abort"), tear the backend down and stop the engine thread."""
        if self._thread is None or self._stopped:
            self._stopping = self._stopped = True
            return
        with self._cond:
            self._stopping = True
        self._command("shutdown")
        self._thread.join()

    @property
    def control_pending(self) -> bool:
        """True while a control call (suspend, resume, shutdown) waits for the engine thread."""
        with self._cond:
            return bool(self._commands)

    def wait_for_control(self, timeout: float) -> bool:
        """Block until a control call is waiting for the engine thread (False if none came within ``timeout``).

        Callable from ``on_token`` (the engine thread): a test or callback can hold a request mid-generation
        until a suspend is on its way, so that request is parked by it whatever the machine's load.
        """
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._commands), timeout)

    def _command(self, kind: str, *, drain: bool = False) -> None:
        if self._thread is None:
            raise LifecycleError(f"engine {kind} before start")
        if threading.current_thread() is self._thread:
            raise LifecycleError(
                f"engine {kind} called from the engine thread (e.g. inside on_token): it would deadlock"
            )
        if self._stopped:
            if kind == "shutdown":
                return
            raise EngineStopped(f"engine {kind} after shutdown")
        cmd = Command(kind, drain=drain)
        with self._cond:
            if drain:
                self._draining = True
            self._commands.append(cmd)
            self._cond.notify_all()
        cmd.done.result()

    def _ready_command_locked(self) -> Command | None:
        if not self._commands:
            return None
        if self._stopping:  # shutdown goes first (a drain-mode suspend waiting for requests would block it)
            stop = next((c for c in self._commands if c.kind == "shutdown"), None)
            if stop is not None:
                self._commands.remove(stop)
                return stop
        cmd = self._commands[0]
        if cmd.kind == "suspend" and cmd.drain and self._awake and self._active:
            return None  # drain: keep stepping the admitted requests until they are all done
        return self._commands.popleft()

    def _execute(self, cmd: Command, backend: StepBackend) -> bool:
        try:
            if cmd.kind == "suspend":
                if self._awake:
                    ended = self._end_for_resubmission(backend) if self.inflight is InflightPolicy.ABORT else 0
                    dt = backend.suspend()
                    with self._cond:
                        self._awake = False
                        self._draining = False
                    self.timings.append(("suspend", float(dt or 0.0)))
                    log.debug(
                        "engine suspended at weight version %d: %d request(s) parked, %d ended for resubmission "
                        "(%d tokens of KV discarded in all so far)",
                        int(self._weight_version()),
                        len(self._active),
                        ended,
                        self.discarded_tokens,
                    )
            elif cmd.kind == "resume":
                if not self._awake:
                    dt = backend.resume()
                    with self._cond:
                        self._awake = True
                        self._draining = False
                        self._cond.notify_all()
                    self.timings.append(("resume", float(dt or 0.0)))
            elif cmd.kind == "shutdown":
                self._abort_everything()
                try:
                    backend.shutdown()
                finally:
                    with self._cond:
                        self._awake = False
                        self._stopped = True
                    self._fail_commands(EngineStopped("engine shut down"))
                cmd.done.set_result(None)
                return False
        except BaseException as exc:
            cmd.done.set_exception(exc)
            return True
        cmd.done.set_result(None)
        return True

    def _end_for_resubmission(self, backend: StepBackend) -> int:
        """``inflight="abort"``: end every active request in the backend and queue it again as prompt + its
        tokens so far (the rest of its ``max_tokens`` to go); the number ended."""
        with self._cond:
            ended = sorted(self._active.values(), key=lambda r: r.seq)
            old_ids = [r.backend_id for r in ended]
            self._active.clear()
            for req in ended:
                req.attempt += 1
                sub = req.submitted
                self.resubmissions += 1
                self.discarded_tokens += len(sub.prompt_ids) + len(req.token_ids)  # the KV this attempt held
                req.backend = dataclasses.replace(
                    sub,
                    request_id=sub.request_id + (req.attempt << 40),  # the same on every rank of a TP group
                    prompt_ids=sub.prompt_ids + tuple(req.token_ids),
                    max_tokens=sub.max_tokens - len(req.token_ids),
                    seed=request_seed(sub.seed, req.attempt),
                )
                req.state = "queued"
                self._queue.append(req)
            self._queue.sort(key=queue_order)
        for rid in old_ids:
            backend.abort(rid)
        return len(ended)

    def _abort_everything(self) -> None:
        with self._cond:
            left = [*self._queue, *self._active.values()]
            self._queue.clear()
            self._active.clear()
            self._pending_aborts.clear()  # the backend's shutdown drops every row
            for req in left:
                self._mark_done_locked(req, "abort")
        for req in left:
            resolve(req)

    def _fail_commands(self, exc: BaseException) -> None:
        with self._cond:
            cmds = list(self._commands)
            self._commands.clear()
        for c in cmds:  # a suspend or shutdown is satisfied by a stopped engine; a resume is not
            if not c.done.done():
                c.done.set_exception(exc) if c.kind == "resume" else c.done.set_result(None)

    def _fail_everything(self, exc: BaseException) -> None:
        with self._cond:
            self._stopped = True
            self._awake = False
            left = [*self._queue, *self._active.values()]
            self._queue.clear()
            self._active.clear()
            self._pending_aborts.clear()
            for req in left:
                req.state = "done"
                self.completed += 1
            self._cond.notify_all()
        for req in left:
            if not req.future.done():
                req.future.set_exception(exc)
        self._fail_commands(exc)


__all__ = ["Suspension"]
