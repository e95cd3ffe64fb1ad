"""Three real gloo ranks (processes forked from tests/support/procs.py's fork server) for the guards whose bugs two
ranks cannot show.

One start of the three runs every case, each on a process group of its own, and the test process orders the ranks'
arrivals (each rank waits for the test's signal before it enters; never a sleep inside a rank):

* ``lockstep``: :class:`~colo_fsm.adapters.lockstep.TorchLockstep` over three ranks: every follower passes a plan of
  its own and must get the leader's back (with the requests it carries);
* ``stop-agreement``: the demo's :class:`~colo_fsm.demo.signals.StopAgreement` and the checkpoint decision it feeds
  (``save_and_stop`` agreed with ``agree_any``), as the demo's loop uses them: rank 2 alone gets a real SIGTERM
  before step 1, and every rank must agree on the signal, save, and end the run at step 1;
* ``barrier-deadline``: a fingerprint :class:`~colo_fsm.guards.barrier.TorchBarrier` whose rank 0 arrives first,
  rank 1 halfway through rank 0's deadline and rank 2 after it: rank 0 must give up at its own deadline, counted
  from its arrival (a per-wait timeout that restarts after rank 1's row came would let rank 2 in).

:func:`run_three_ranks` returns what each rank reported per case; the ``judge_*`` functions turn it into problems
(empty when the guard held). ``mutants`` swaps one component per case for its mutant in every rank
(:data:`tests.support.mutants.SUITE_MUTANTS`).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import time
from collections.abc import Iterable
from typing import Any

DEADLINE_S = 3.0  # rank 0's barrier deadline
RANK1_AT = 0.5  # rank 1 arrives this fraction of the deadline after rank 0 (well inside it)
LATE_BY_S = 0.9  # rank 2 arrives this long after rank 0's deadline (a restarted wait would still be open for 0.6 s)
WORLD = 3
CASES = ("lockstep", "stop-agreement", "barrier-deadline")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _component(mutants: Iterable[str], case: str, default: Any) -> Any:
    chosen = [m for m in mutants if m in MUTANT_CASES and MUTANT_CASES[m] == case]
    if not chosen:
        return default
    from tests.support.mutants import SUITE_MUTANTS

    return SUITE_MUTANTS[chosen[0]].component()


MUTANT_CASES = {
    "lockstep-follower-plans-its-own-step": "lockstep",
    "sigterm-not-agreed-across-ranks": "stop-agreement",
    "barrier-deadline-restarts-per-wait": "barrier-deadline",
}


def worker(rank: int, port: int, mutants: tuple[str, ...], out: Any, go: Any) -> None:
    """One rank: every case in order, each reported as ``(case, rank, kind, payload)`` on ``out``."""
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        groups = {case: dist.new_group(list(range(WORLD)), backend="gloo") for case in CASES}
        for case in CASES:
            try:
                payload = _CASE_RUN[case](rank, groups[case], mutants, out, go)
                out.put((case, rank, "done", payload))
            except Exception as exc:  # reported, judged by the test
                out.put((case, rank, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _lockstep(rank: int, group: Any, mutants: tuple[str, ...], out: Any, go: Any) -> Any:
    from colo_fsm.adapters.lockstep import CarriedRequest, StepPlan, TorchLockstep

    cls = _component(mutants, "lockstep", TorchLockstep)
    lock = cls(group, src=0, width=64)
    carried = CarriedRequest(1 << 48, (5, 6, 7), max_tokens=4, temperature=0.5, seed=3)
    own = (
        StepPlan("step", (2, carried.request_id), (1,), carried=(carried,))
        if rank == 0
        else StepPlan("suspend", (100 + rank,), drain=True)  # what a follower would have planned by itself
    )
    return [repr(lock.agree(own)), repr(lock.agree(StepPlan("noop") if rank == 0 else StepPlan("step", (rank,))))]


def _stop_agreement(rank: int, group: Any, mutants: tuple[str, ...], out: Any, go: Any) -> Any:
    from colo_fsm.demo.signals import StopAgreement, StopSignals
    from colo_fsm.guards.decision import CheckpointDecision

    signals = StopSignals(escalate=False, rank=rank).install()
    try:
        stop = _component(mutants, "stop-agreement", StopAgreement)(signals, group=group, world=WORLD)
        decision = CheckpointDecision(
            None, save_and_stop=lambda: stop.signum == signal.SIGTERM, agree=stop.agree_any
        )  # the demo's checkpoint decision (colo_fsm/demo/run.py)
        steps = []
        for step in range(3):
            if step == 1 and rank == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # a real signal, to this rank alone
            sig = stop.agree()  # the loop's per-step agreement
            steps.append((step, sig, decision.decide(step), decision.stops_run(step)))
            if decision.stops_run(step):
                break
        return steps
    finally:
        signals.close()


def _barrier_deadline(rank: int, group: Any, mutants: tuple[str, ...], out: Any, go: Any) -> Any:
    from colo_fsm.errors import BarrierTimeout
    from colo_fsm.guards.barrier import TorchBarrier
    from colo_fsm.guards.fingerprint import HandoffFingerprint

    barrier = _component(mutants, "barrier-deadline", TorchBarrier)(group, timeout_s=DEADLINE_S)
    if rank:
        go[rank].wait(120)  # the test lets rank 1, then rank 2 in
    out.put(("barrier-deadline", rank, "arrived", time.monotonic()))
    try:
        barrier.wait(state="Draining", weight_version=3, fingerprint=HandoffFingerprint("Draining", 1, 3))
        return "passed"
    except BarrierTimeout as exc:
        return f"timeout: {exc}"


_CASE_RUN = {"lockstep": _lockstep, "stop-agreement": _stop_agreement, "barrier-deadline": _barrier_deadline}


class _Inbox:
    def __init__(self, q: Any) -> None:
        self.q = q
        self.seen: dict[tuple[str, int, str], Any] = {}

    def get(self, case: str, rank: int, kind: str, until: float) -> Any:
        """The payload of ``(case, rank, kind)`` (or of an error report), None if none by ``until``."""
        while True:
            for k in (kind, "error"):
                if (case, rank, k) in self.seen:
                    return (k, self.seen.pop((case, rank, k)))
            left = until - time.monotonic()
            if left <= 0:
                return None
            try:
                c, r, k, payload = self.q.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self.seen[(c, r, k)] = payload


def run_three_ranks(mutants: Iterable[str] = ()) -> dict[str, dict[int, Any]]:
    """Start the three ranks, order the barrier case's arrivals, and collect every case's reports:
    ``{case: {rank: (kind, payload) or None}}`` (None: nothing came within the bound)."""
    from tests.support.procs import rank_context

    ctx = rank_context()
    out = ctx.Queue()
    go = {1: ctx.Event(), 2: ctx.Event()}
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, port, tuple(mutants), out, go)) for r in range(WORLD)]
    for p in procs:
        p.start()
    inbox = _Inbox(out)
    got: dict[str, dict[int, Any]] = {case: {} for case in CASES}
    try:
        for case in ("lockstep", "stop-agreement"):
            for r in range(WORLD):
                got[case][r] = inbox.get(case, r, "done", time.monotonic() + 120)
        arrived = inbox.get("barrier-deadline", 0, "arrived", time.monotonic() + 120)
        if arrived is None or arrived[0] != "arrived":
            got["barrier-deadline"] = {0: arrived}
            return got
        t0 = float(arrived[1])  # rank 0's arrival (CLOCK_MONOTONIC is one clock for every process here)
        time.sleep(max(0.0, t0 + RANK1_AT * DEADLINE_S - time.monotonic()))
        go[1].set()
        # rank 0 should give up at t0 + DEADLINE_S; rank 2 comes LATE_BY_S after that, whatever rank 0 said
        early = inbox.get("barrier-deadline", 0, "done", t0 + DEADLINE_S + LATE_BY_S)
        go[2].set()
        got["barrier-deadline"][0] = early or inbox.get("barrier-deadline", 0, "done", time.monotonic() + 60)
        for r in (1, 2):
            got["barrier-deadline"][r] = inbox.get("barrier-deadline", r, "done", time.monotonic() + 60)
        return got
    finally:
        for e in go.values():
            e.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


# ---------------------------------------------------------------------------------------------- judges
def judge_lockstep(reports: dict[int, Any]) -> list[str]:
    """Every rank got the leader's (rank 0's) plan, every round: a follower never plans its own step."""
    problems = []
    leader = reports.get(0)
    for r in range(WORLD):
        rep = reports.get(r)
        if rep is None or rep[0] != "done":
            problems.append(f"rank {r} reported {rep!r} instead of its plans")
        elif leader is not None and leader[0] == "done" and rep[1] != leader[1]:
            problems.append(f"rank {r} took the plans {rep[1]}, not the leader's {leader[1]}")
    return problems


def judge_stop_agreement(reports: dict[int, Any]) -> list[str]:
    """A SIGTERM to rank 2 alone is every rank's at the same step boundary: all save and end the run there."""
    want = [(0, 0, False, False), (1, int(signal.SIGTERM), True, True)]
    problems = []
    for r in range(WORLD):
        rep = reports.get(r)
        got = [tuple(x) for x in rep[1]] if rep is not None and rep[0] == "done" else rep
        if got != want:
            problems.append(
                f"rank {r}: (step, agreed signal, saves, ends the run) = {got}, every rank expected {want} (a SIGTERM "
                "to one rank is agreed by all at the next step boundary)"
            )
    return problems


def judge_barrier_deadline(reports: dict[int, Any]) -> list[str]:
    """Rank 0 gave up at its own deadline, counted from its arrival: it did not pass with a rank that came later."""
    rep = reports.get(0)
    if rep is None:
        return ["rank 0 never reported from the barrier"]
    if rep[0] != "done" or not str(rep[1]).startswith("timeout"):
        return [
            f"rank 0 {rep[1]!r}: rank 2 arrived {LATE_BY_S:g}s after rank 0's {DEADLINE_S:g}s deadline (counted from "
            "rank 0's arrival), so rank 0 must have raised BarrierTimeout (its wait for rank 2 restarted the timeout)"
        ]
    if "rank=0" not in str(rep[1]) or "Draining" not in str(rep[1]):
        return [f"rank 0's timeout must name its rank and state: {rep[1]}"]
    return []


JUDGES = {
    "lockstep": judge_lockstep,
    "stop-agreement": judge_stop_agreement,
    "barrier-deadline": judge_barrier_deadline,
}


__all__ = [
    "CASES",
    "JUDGES",
    "MUTANT_CASES",
    "judge_barrier_deadline",
    "judge_lockstep",
    "judge_stop_agreement",
    "run_three_ranks",
]
