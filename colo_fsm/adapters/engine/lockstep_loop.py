"""One engine-loop iteration of a tensor-parallel group: the leader plans it, every rank carries it out.

See :mod:`colo_fsm.adapters.lockstep` for why TP peers must issue one schedule. The leader plans what its own
loop would do (a command, or the aborts and admissions before one decode step); followers wait for the planned
requests and commands to reach them. Aborts are planned only while the engine is awake, like the plain loop's.

A request the leader alone was given (``submit(feed=True)``) travels in the plan that first admits it
(:class:`~colo_fsm.adapters.lockstep.CarriedRequest`) and a follower adds the same request on its own. So a
follower never waits for work of its own: it goes straight to the agreement and waits there for the leader's
plan; an idle leader plans a noop every :data:`~colo_fsm.adapters.lockstep.LOCKSTEP_HEARTBEAT_S` so that wait
stays inside the group's timeout. Every rank steps when the plan says step, even one with no row of its own left.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

from colo_fsm.adapters.engine.admission import Admission
from colo_fsm.adapters.engine.protocol import BackendRequest
from colo_fsm.adapters.engine.results import EngineRequest, resolve
from colo_fsm.adapters.engine.state import Command
from colo_fsm.adapters.engine.stepping import Stepping
from colo_fsm.adapters.engine.suspension import Suspension
from colo_fsm.adapters.lockstep import LOCKSTEP_HEARTBEAT_S, CarriedRequest, Lockstep, StepPlan, room_for
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
        room = room_for(width)
        aborts = tuple(self._pending_aborts[:room]) if self._aborts_due_locked() else ()
        admit = self._admissible_locked(room)
        kind = "step" if self._awake and not self._stopping and (self._active or admit) else "noop"
        # a leader-only request travels in the plan of its first admission (a resubmission is queued everywhere)
        carried = tuple(carried_of(r) for r in admit if r.fed and not r.attempt)
        return StepPlan(kind, tuple(r.backend_id for r in admit), aborts, carried=carried)

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
            cmd: Command | None = None
            # the leader plans once it has something to do, or after an idle heartbeat (a noop plan keeps the
            # followers' wait inside the group's timeout); a follower goes straight to the agreement: the leader's
            # plan is what it waits for, requests only the leader was given included
            while lock.leader:
                cmd = self._peek_command_locked()
                if cmd is not None or self._aborts_due_locked() or self._can_step_locked():
                    break
                if not self._sleep_locked(LOCKSTEP_HEARTBEAT_S):
                    break
            mine = self._plan_locked(cmd, lock.width) if lock.leader else StepPlan("noop")
            waits_idle = not lock.leader and not (self._active or self._queue or self._commands)
            if waits_idle:  # a follower with nothing of its own waits for the leader's plan: it is idle
                self.idle_waits += 1
                self.idle = True
                self._cond.notify_all()
        try:
            plan = lock.agree(mine)
        finally:
            if waits_idle:
                with self._cond:
                    self.idle = False
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
                fed = {c.request_id: c for c in plan.carried}
                for rid in plan.admit:
                    if not lock.leader and rid in fed:  # the leader's alone: add the same request here
                        req = self._fed_request(fed[rid])
                        self._queue.append(req)
                    else:
                        self._wait_locked(f"request {rid}", self._queued_check(rid))
                        req = next(r for r in self._queue if r.backend_id == rid)
                    self._admit_locked(req)
                    admit.append(req)
        for rid in plan.abort:
            backend.abort(rid)
        if planned is not None:
            return self._execute(planned, backend)
        self._add_to_backend(backend, admit)
        # every rank steps on the leader's word (rows this rank ended may still run); never while suspended
        if plan.kind == "step" and self._awake:
            self._step(backend)
        return True

    def _fed_request(self, c: CarriedRequest) -> EngineRequest:
        """A follower's record of a request the leader alone was given (nobody here waits on its future)."""
        return EngineRequest(
            backend=BackendRequest(
                c.request_id,
                c.prompt_ids,
                c.max_tokens,
                c.temperature,
                c.top_p,
                c.top_k,
                c.seed,
                c.top_logprobs,
                c.logprobs_mode,
            ),
            priority=c.priority,
            seq=next(self._seq),
            stop_token_ids=frozenset(c.stop_token_ids),
            on_token=None,
            future=concurrent.futures.Future(),
            fed=True,
        )


def carried_of(req: EngineRequest) -> CarriedRequest:
    """The wire record of a leader-only request (what a follower needs to add the same request)."""
    b = req.backend
    return CarriedRequest(
        b.request_id,
        b.prompt_ids,
        b.max_tokens,
        b.temperature,
        b.top_p,
        b.top_k,
        b.seed,
        b.top_logprobs,
        tuple(sorted(req.stop_token_ids)),
        req.priority,
        b.logprobs_mode,
    )


__all__ = ["LockstepIteration", "carried_of"]
