"""Fault injection: an exception, a hang and a dead rank at every action of every transition (thread ranks),
plus a real two-process gloo run where one rank dies or never arrives at the TorchBarrier."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from colo_fsm.errors import ActionFailed, BarrierTimeout
from colo_fsm.states.spec import LIFECYCLE, State
from tests.support import faults
from tests.support.faults import FaultKind, FaultPoint, check_outcome, fault_points, rest_points, run_all
from tests.support.report import record_stats

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _quiet_lifecycle_logs():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def test_every_declared_action_of_every_transition_is_a_fault_point():
    assert faults.uncovered() == []
    points = fault_points()
    declared = sum(len(t.actions) for t in LIFECYCLE.transitions)
    assert len(points) == declared
    # every state in which actions run, and every action of the spec
    assert {p.dest for p in points} >= {s.state for s in LIFECYCLE.states} - {State.CREATED, State.FAILED}
    assert {p.action for p in points} == {a.name for a in LIFECYCLE.actions}
    assert {p.dest for p in rest_points()} == {State.CREATED, State.GENERATING, State.VALIDATING, State.DONE}


@pytest.mark.parametrize("kind", [FaultKind.RAISE, FaultKind.RAISE_AFTER, FaultKind.HANG, FaultKind.DIE])
def test_fault_at_every_action_two_thread_ranks(kind, tmp_path):
    runs = run_all(kind, root=tmp_path)
    problems = [p for r in runs for p in check_outcome(r)]
    assert not problems, "\n".join(problems)
    assert all(r.outcomes[r.victim].fault_fired for r in runs)
    failed_peers = sum(1 for r in runs for o in r.outcomes.values() if o.rank != r.victim and o.state is State.FAILED)
    # the faulty rank's peers noticed through their barrier wherever a barrier was left
    assert failed_peers == sum(1 for r in runs if r.barrier_after)
    record_stats(f"faults_injected_{kind.value}", len(runs))


def test_rank_dies_while_resting_in_every_resting_state(tmp_path):
    runs = run_all(FaultKind.DIE, root=tmp_path, resting=True)
    problems = [p for r in runs for p in check_outcome(r)]
    assert not problems, "\n".join(problems)
    assert len(runs) == 4
    record_stats("faults_injected_die_resting", len(runs))


def test_four_ranks_one_dies_just_before_its_save_checkpoint_runs(tmp_path):
    """Rank 2 dies at the save_checkpoint action, before its save starts (nothing of it is written); the peers
    save, then time out at the next barrier. A real save interrupted mid-write: tests/test_checkpoint_interrupted.py.
    """
    point = FaultPoint("conclude", State.TRAINING, State.CHECKPOINTING, "save_checkpoint")
    sc = fault_points()[point]
    run = faults.run_ranks(sc, fault=point, kind=FaultKind.DIE, world=4, victim=2, barrier_timeout_s=1.5, root=tmp_path)
    assert check_outcome(run) == []
    for r in (0, 1, 3):
        o = run.outcomes[r]
        assert o.state is State.FAILED and isinstance(o.failure.cause, BarrierTimeout)
        assert o.failure.state == "Waking" and o.failure.rank == r  # the barrier after the save
        # peers completed their own save before meeting the barrier: it is on disk, complete
        assert o.on_disk == o.saves_completed and o.half_written == []


def test_the_fault_harness_is_not_vacuous(tmp_path, monkeypatch):
    """With the documented quiesce-after-failure removed, the harness reports engines left awake."""
    monkeypatch.setattr(faults.FaultyLifecycle, "_quiesce_after_failure", lambda self: None)
    point = FaultPoint("resume", State.WAKING, State.GENERATING, "resume_collector")
    run = faults.run_ranks(
        fault_points()[point], fault=point, kind=FaultKind.RAISE, world=2, barrier_timeout_s=1.5, root=tmp_path
    )
    assert any("engine awake" in p for p in check_outcome(run))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_gloo_rank_dies_or_never_arrives_at_torch_barrier():
    """Two real worlds of two gloo processes at once: in one rank 1 dies, in the other it never arrives.

    The never-arrives world starts late (a loaded machine): rank 1's hang must still outlast rank 0's timeout,
    counted from when it begins, not from process start."""
    from tests.support.procs import rank_context

    ctx = rank_context()
    out = ctx.Queue()
    timeout_s = 2.0
    procs = []
    for mode in ("die", "never_arrives"):
        port = _free_port()
        for rank in (0, 1):
            delay = timeout_s * 2 + 0.5 if mode == "never_arrives" else 0.0
            p = ctx.Process(target=faults.gloo_fault_worker, args=(rank, 2, port, mode, timeout_s, out, delay))
            procs.append((mode, rank, p))
    for _m, _r, p in procs:
        p.start()
    results: dict[tuple[str, int], dict] = {}
    try:
        for _ in range(4):  # rank 0 of each world; the dead rank 1 says so before it exits; the late one reports
            mode, rank, res = out.get(timeout=120)
            results[(mode, rank)] = res
    finally:
        for _m, _r, p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert results[("die", 1)] == {"died": True}
    late = results[("never_arrives", 1)]  # arrives after rank 0 gave up: its own barrier fails too, naming rank 1
    assert late["state"] == "Failed" and late["failure_rank"] == 1 and late["failure_state"] == "Draining", late
    for mode in ("die", "never_arrives"):
        res = results[(mode, 0)]
        assert res["state"] == "Failed", res
        assert res["cause"] == "BarrierTimeout", res
        assert res["failure_state"] == "Draining" and res["failure_rank"] == 0 and res["failure_wv"] == 1, res
        assert "state=Draining" in res["error"] and "rank=0" in res["error"] and "weight_version=1" in res["error"]
        assert res["waited_s"] < 60, "the barrier must give up near its timeout"
        assert res["engine"] == "suspended" and res["collector_running"] is False
    record_stats("faults_injected_gloo", 2)


def test_faulty_lifecycle_without_fault_is_the_lifecycle(tmp_path):
    run = faults.run_ranks(faults.SCENARIOS[0], world=3, root=tmp_path)
    assert check_outcome(run) == []
    assert all(o.state is State.STOPPED for o in run.outcomes.values())
    assert all(o.on_disk == [(2, 2), (4, 4)] for o in run.outcomes.values())


def test_action_failed_type_is_reported():
    assert issubclass(ActionFailed, Exception)


def test_a_slow_healthy_barrier_is_not_a_failure(tmp_path, monkeypatch):
    """Under load a healthy rank can reach a barrier long after its peer: before the fault fired, barriers wait
    the healthy timeout, so only the injected fault fails the run (here: the short timeout is 0.3 s, rank 0's
    training step takes 1 s before the Waking barrier)."""
    real = faults.AtomicCheckpointTrainer.train_step

    def slow_train_step(self, batch):
        if self.root.name == "rank0" and self.steps == 0:
            time.sleep(1.0)
        return real(self, batch)

    monkeypatch.setattr(faults.AtomicCheckpointTrainer, "train_step", slow_train_step)
    point = FaultPoint("resume", State.WAKING, State.GENERATING, "resume_collector")
    run = faults.run_ranks(
        fault_points()[point], fault=point, kind=FaultKind.RAISE, world=2, barrier_timeout_s=0.3, root=tmp_path
    )
    assert check_outcome(run) == []
    victim = run.outcomes[run.victim]
    assert victim.fault_fired and victim.trained >= 1 and isinstance(victim.failure, ActionFailed)


def _meet(shared, timeout: float) -> str:
    """One rank's wait at the shared barrier: "met" when every rank came, "broken" when it was broken."""
    try:
        shared.wait(timeout=timeout)
        return "met"
    except threading.BrokenBarrierError:
        return "broken"


def _ranks_in_barrier(shared, hold, results):
    """Two rank threads: each meets the barrier (a wait begun while healthy: its timeout is longer than the
    peers'), then stays alive until ``hold`` is set, then meets it again."""
    passed = threading.Barrier(3)  # the two ranks past their first wait, and the test

    def rank(r: int) -> None:
        shared.wait(timeout=30)
        passed.wait(timeout=10)
        hold.wait(30)
        results[r] = _meet(shared, 30)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    passed.wait(timeout=10)
    return threads


def _breaker(shared, fault, threads):
    """The harness's breaker in a thread of its own, with the peers' timeout 0.2 s; returns the event it sets each
    time it has looked at the barrier after that timeout."""
    checked = threading.Event()
    args = (shared, fault, 0.2, threads, checked)
    threading.Thread(target=faults._break_after_fault, args=args, daemon=True).start()
    return checked


def test_the_fault_breaker_leaves_alone_a_barrier_every_rank_has_left():
    """After the fault, ranks still running (recovering, or not yet scheduled) that are not in the barrier must find
    it whole: the breaker breaks only a barrier a rank is held in. Forced: both ranks are past the barrier and
    parked on an event while the breaker looks, past its deadline."""
    shared, fault, hold, results = (
        faults._HandoffBarrier(2, peers_timeout_s=1.0),
        threading.Event(),
        threading.Event(),
        {},
    )
    threads = _ranks_in_barrier(shared, hold, results)
    fault.set()
    assert _breaker(shared, fault, threads).wait(10), "the breaker never looked past its deadline"
    assert not shared.broken
    hold.set()
    for t in threads:
        t.join(10)
    assert results == {0: "met", 1: "met"}


def test_a_released_barrier_holds_no_rank_before_its_ranks_run_again():
    """The moment a generation is released every rank's wait is still on record, since none has run since: the
    breaker must already see no rank held. Forced inside the release itself."""
    seen: list[bool] = []

    class Probe(faults._HandoffBarrier):
        def _released(self) -> None:  # the barrier's action: run under its lock, before it wakes any rank
            super()._released()
            seen.append(self.holds_a_healthy_wait())

    shared = Probe(2, peers_timeout_s=1.0)
    threads = [threading.Thread(target=shared.wait, kwargs={"timeout": 30}, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [False]


def test_the_fault_breaker_breaks_a_barrier_a_healthy_rank_is_held_in():
    """The other side: a rank waits (with the long healthy timeout) for a victim that never comes; the breaker
    breaks that barrier once the peers' timeout after the fault ran out."""
    shared, fault, out = faults._HandoffBarrier(2, peers_timeout_s=1.0), threading.Event(), []
    t = threading.Thread(target=lambda: out.append(_meet(shared, 60)), daemon=True)
    t.start()
    while shared.n_waiting < 1:
        time.sleep(0.01)
    fault.set()
    faults._break_after_fault(shared, fault, 0.2, [t])
    t.join(10)
    assert out == ["broken"]


def test_the_fault_breaker_breaks_a_healthy_wait_that_arrives_after_its_deadline():
    """A rank chose its long timeout before the fault, then was not scheduled until after the breaker's deadline:
    its wait still gets broken when it arrives, not left to run out 60 s later. Forced: the rank is held on an
    event until the breaker has looked past its deadline."""
    shared, fault, go, out = faults._HandoffBarrier(2, peers_timeout_s=1.0), threading.Event(), threading.Event(), []

    def rank() -> None:
        go.wait(30)
        out.append(_meet(shared, 60))  # the timeout it chose while healthy

    t = threading.Thread(target=rank, daemon=True)
    t.start()
    fault.set()
    assert _breaker(shared, fault, [t]).wait(10), "the breaker never looked past its deadline"
    go.set()
    t.join(10)
    assert out == ["broken"]


def test_the_fault_breaker_leaves_a_wait_begun_after_the_fault_to_its_own_timeout():
    """A wait begun after the fault has the peers' timeout, counted from its own start: a peer that arrives after
    the breaker's deadline but within that timeout meets it. Forced: the second rank starts only once the breaker
    has looked past its deadline with the first rank held."""
    shared, fault, results = faults._HandoffBarrier(2, peers_timeout_s=30.0), threading.Event(), {}

    def rank(r: int) -> None:
        results[r] = _meet(shared, 30)  # the peers' timeout: begun after the fault

    fault.set()
    first = threading.Thread(target=rank, args=(0,), daemon=True)
    first.start()
    while shared.n_waiting < 1:
        time.sleep(0.01)
    second = threading.Thread(target=rank, args=(1,), daemon=True)
    checked = _breaker(shared, fault, [first, second])
    assert checked.wait(10), "the breaker never looked past its deadline"
    second.start()
    for t in (first, second):
        t.join(10)
    assert results == {0: "met", 1: "met"}
