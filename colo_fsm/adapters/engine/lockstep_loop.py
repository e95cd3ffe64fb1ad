"""One engine-loop iteration of a tensor-parallel group: the leader plans it, every rank carries it out.

See :mod:`colo_fsm.adapters.lockstep` for why TP peers must issue one schedule. The leader plans what its own
loop would do (a command, or the aborts and admissions before one decode step); followers wait for the planned
requests and commands to reach them. Aborts are planned only while the engine is awake, like the plain loop's.
"""

from __future__ import annotations

from collections.abc import Callable

from colo_fsm.adapters.engine.admission import Admission
from colo_fsm.adapters.engine.results import EngineRequest, resolve
from colo_fsm.adapters.engine.state import Command
from colo_fsm.adapters.engine.stepping import Stepping
from colo_fsm.adapters.engine.suspension import Suspension
from colo_fsm.adapters.lockstep import Lockstep, StepPlan
from colo_fsm.errors import LifecycleError


class LockstepIteration(Admission, Suspension, Stepping):
    """The engine loop's tensor-parallel iteration (a part of :class:`~colo_fsm.adapters.engine.ContinuousBatcher`)."""

    def _peek_command_locked(self) -> Command | None:
        if not self._commands:
            return None
        if self._stopping:
            stop = next((c for c in self._commands if c.kind == "shutdown"), None)
            if stop is not None:
                return stop
        cmd = self._commands[0]
        if cmd.kind == "suspend" and cmd.drain and self._awake and self._active:
            return None
        return cmd

    def _plan_locked(self, cmd: Command | None, width: int) -> StepPlan:
        """The leader's plan of this iteration (what the unlocked loop would do)."""
        if cmd is not None:
            return StepPlan(cmd.kind, drain=cmd.drain)
        room = max(0, (width - 4) // 2)
        aborts = tuple(self._pending_aborts[:room]) if self._aborts_due_locked() else ()
        admit = [r.backend_id for r in self._admissible_locked(room)]
        kind = "step" if self._awake and not self._stopping and (self._active or admit) else "noop"
        return StepPlan(kind, tuple(admit), aborts)

    def _wait_locked(self, what: str, ready: Callable[[], bool]) -> None:
        if not self._cond.wait_for(ready, timeout=self._lockstep_wait_s):
            raise LifecycleError(
                f"lockstep: the group's leader planned {what}, which never reached this rank within "
                f"{self._lockstep_wait_s:.0f} s (requests and control calls must be the same on every rank of "
                "the tensor-parallel group)"
            )

    def _queued_check(self, request_id: int) -> Callable[[], bool]:
        return lambda: any(r.backend_id == request_id for r in self._queue)

    def _loop_once_lockstep(self, lock: Lockstep) -> bool:
        """One iteration of a tensor-parallel group: agree on the leader's plan, then every rank carries it out."""
        with self._cond:
            while True:  # enter the group's agreement only with something to do (the leader does the same)
                cmd = self._peek_command_locked()
                has_cmd = bool(self._commands) if not lock.leader else cmd is not None
                if has_cmd or self._aborts_due_locked() or self._can_step_locked():
                    break
                self._sleep_locked()
            mine = self._plan_locked(cmd, lock.width) if lock.leader else StepPlan("noop")
        plan = lock.agree(mine)
        backend = self.backend
        assert backend is not None
        admit: list[EngineRequest] = []
        planned: Command | None = None
        with self._cond:
            if lock.leader:
                self._pending_aborts = [r for r in self._pending_aborts if r not in plan.abort]
            else:
                for rid in plan.abort:  # the leader's caller aborted it: leave the schedule here too
                    req = self._active.pop(rid, None) or next((r for r in self._queue if r.backend_id == rid), None)
                    if req is not None and req.state != "done":
                        if req in self._queue:
                            self._queue.remove(req)
                        self._mark_done_locked(req, "abort")
                        resolve(req)
            if plan.kind in ("suspend", "resume", "shutdown"):
                self._wait_locked(f"a {plan.kind}", lambda: any(c.kind == plan.kind for c in self._commands))
                planned = next(c for c in self._commands if c.kind == plan.kind)
                self._commands.remove(planned)
            elif plan.kind == "step":
                for rid in plan.admit:
                    self._wait_locked(f"request {rid}", self._queued_check(rid))
                    req = next(r for r in self._queue if r.backend_id == rid)
                    self._admit_locked(req)
                    admit.append(req)
        for rid in plan.abort:
            backend.abort(rid)
        if planned is not None:
            return self._execute(planned, backend)
        self._add_to_backend(backend, admit)
        if plan.kind == "step" and self._active and self._awake:  # never a decode step on a suspended engine
            self._step(backend)
        return True


__all__ = ["LockstepIteration"]
