"""A scripted step backend whose every step, suspend, resume and shutdown can be held by the test.

Tests of the engine loop force an interleaving with it instead of sleeping: :meth:`GatedBackend.grant` lets ``n``
decode steps run (a step waits for its grant), and ``hold("suspend")`` / ``hold("resume")`` /
``hold("shutdown")`` make that call wait inside the backend until :meth:`GatedBackend.release`, so a test can do
something exactly while it runs. A row's ``i``-th token is ``(prompt[0] + len(prompt) - 1 + i) % 50``: a one-token
prompt ``[p]`` gives ``p, p+1, ...``, and the same request resubmitted as prompt + its first ``k`` tokens goes on
with ``p+k`` (a continuation, as a real engine's would be).
The backend behaves like a real engine where it matters: a step while suspended raises (as the CPU loop and
megatron-core do), and every call a real engine must never see is recorded in :attr:`GatedBackend.violations`.
"""

from __future__ import annotations

import threading
from typing import Any

from colo_fsm.adapters.batching import BackendRequest, StepOutput
from colo_fsm.errors import LifecycleError

WAIT = 60.0  # seconds any wait may take before the test fails by assertion (never compared with anything)


class GatedBackend:
    """A :class:`~colo_fsm.adapters.batching.StepBackend` driven step by step from the test (see module doc)."""

    name = "gated"

    def __init__(self, *, free: bool = False) -> None:
        self.rows: dict[int, list[Any]] = {}  # request id -> [request, tokens generated]
        self.suspended = False
        self.in_step = False
        self.steps = 0
        self.log: list[tuple[Any, ...]] = []  # ("add"|"abort", id), ("step", ids), ("suspend",), ...
        self.added: list[BackendRequest] = []  # every request added, in order
        self.violations: list[str] = []
        self.entered = {k: threading.Event() for k in ("suspend", "resume", "shutdown")}
        self._release = {k: threading.Event() for k in ("suspend", "resume", "shutdown")}
        self._held: set[str] = set()
        self._gate = threading.Condition()
        self._budget = 0
        self._free = free
        self.waiting = False  # a decode step is in flight, waiting for its grant

    # ------------------------------------------------------------------ test controls
    def grant(self, n: int) -> None:
        """Let ``n`` more decode steps run."""
        with self._gate:
            self._budget += n
            self._gate.notify_all()

    def run_free(self) -> None:
        """Let every further step run without a grant."""
        with self._gate:
            self._free = True
            self._gate.notify_all()

    def wait_steps(self, n: int) -> None:
        """Wait (bounded, by assertion) until ``n`` steps in all have run."""
        with self._gate:
            assert self._gate.wait_for(lambda: self.steps >= n, WAIT), f"only {self.steps} of {n} steps ran"

    def wait_blocked(self) -> None:
        """Wait (bounded) until a decode step is in flight, held at its grant: a suspend requested now lands
        after that step, never before it."""
        with self._gate:
            assert self._gate.wait_for(lambda: self.waiting, WAIT), "no decode step came to its grant"

    def hold(self, call: str) -> None:
        """Make the next ``call`` ("suspend", "resume", "shutdown") wait inside the backend until released."""
        self._held.add(call)

    def release(self, call: str) -> None:
        """Let a held ``call`` return."""
        self._release[call].set()

    def wait_entered(self, call: str) -> None:
        """Wait (bounded) until the engine thread is inside ``call``."""
        assert self.entered[call].wait(WAIT), f"the engine thread never called {call}"

    def active_ids(self) -> list[int]:
        """Request ids with a row in the engine."""
        return sorted(self.rows)

    def steps_after(self, marker: str) -> list[tuple[int, ...]]:
        """The rows of every step logged after the last ``marker`` call ("resume", "suspend", ...)."""
        last = max((i for i, e in enumerate(self.log) if e[0] == marker), default=-1)
        return [e[1] for e in self.log[last + 1 :] if e[0] == "step"]

    # ------------------------------------------------------------------ StepBackend
    def _call(self, call: str) -> None:
        self.entered[call].set()
        if call in self._held:
            assert self._release[call].wait(WAIT), f"{call} was held and never released"

    def add(self, request: BackendRequest) -> None:
        if self.suspended:
            self.violations.append(f"add {request.request_id} while suspended")
        self.rows[request.request_id] = [request, 0]
        self.added.append(request)
        self.log.append(("add", request.request_id))

    def step(self) -> list[StepOutput]:
        if self.suspended:
            self.violations.append(f"decode step {self.steps} on a suspended engine")
            raise LifecycleError("decode step on a suspended engine (a handoff must stop at a step boundary)")
        with self._gate:
            self.waiting = True
            self._gate.notify_all()
            ok = self._gate.wait_for(lambda: self._free or self._budget > 0, WAIT)
            self.waiting = False
            assert ok, "a decode step waited for a grant that never came"
            if not self._free:
                self._budget -= 1
        self.in_step = True
        self.log.append(("step", tuple(sorted(self.rows))))
        out = []
        for rid, row in list(self.rows.items()):
            req, i = row
            row[1] = i + 1
            done = "length" if i + 1 >= req.max_tokens else None
            tok = (req.prompt_ids[0] + len(req.prompt_ids) - 1 + i) % 50
            out.append(StepOutput(rid, (tok,), (-1.0,), done))
            if done:
                del self.rows[rid]
        self.in_step = False
        with self._gate:
            self.steps += 1
            self._gate.notify_all()
        return out

    def abort(self, request_id: int) -> None:
        if self.suspended:
            self.violations.append(f"abort {request_id} on a suspended engine")
        self.rows.pop(request_id, None)
        self.log.append(("abort", request_id))

    def suspend(self) -> float:
        if self.in_step:
            self.violations.append("suspend while a decode step was in flight")
        self._call("suspend")
        self.suspended = True
        self.log.append(("suspend",))
        return 0.0

    def resume(self) -> float:
        self._call("resume")
        self.suspended = False
        self.log.append(("resume",))
        return 0.0

    def shutdown(self) -> None:
        self._call("shutdown")
        self.rows = {}
        self.suspended = True
        self.log.append(("shutdown",))


def run_calls(calls: list[Any], backends: list[GatedBackend], *, step_in_flight: bool) -> None:
    """Run each control ``call`` (e.g. ``batcher.suspend``) on its own thread, as the ranks of one program do.

    With ``step_in_flight`` each backend first has a decode step held at its grant, and that step is let go
    only once every call is queued for its engine thread: the call lands right after that step, on every run.
    """
    if step_in_flight:
        for be in backends:
            be.wait_blocked()
    ts = [threading.Thread(target=c) for c in calls]
    for t in ts:
        t.start()
    if step_in_flight:
        for c in calls:
            assert c.__self__.wait_for_control(WAIT), "the control call never reached the engine thread"
        for be in backends:
            be.grant(1)
    for t in ts:
        t.join(WAIT)
    assert not any(t.is_alive() for t in ts), "a control call never returned"


__all__ = ["WAIT", "GatedBackend", "run_calls"]
