"""Barrier with a timeout: real gloo processes on the CPU, one of which never arrives."""

import os
import socket
import threading

import pytest

from colo_fsm.errors import BarrierTimeout, ConfigError
from colo_fsm.guards.barrier import SoloBarrier, ThreadBarrier, TorchBarrier
from colo_fsm.guards.decision import LatchedDecision, broadcast_from_rank0
from tests.support.procs import rank_context
from tests.support.waits import get_or_fail


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, timeout_s: float, out) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        barrier = TorchBarrier(timeout_s=timeout_s)
        try:
            barrier.wait(state="Draining", weight_version=7)
            # ranks whose clocks disagree still latch one decision: rank 0's
            agreed = LatchedDecision("save", lambda step: rank == 0, agree=broadcast_from_rank0()).decide(0)
            out.put((rank, "ok", agreed))
        except BarrierTimeout as exc:
            out.put((rank, "timeout", str(exc)))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _run(timeout_s: float):
    ctx = rank_context()
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, timeout_s, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(2):
        rank, kind, payload = get_or_fail(out, 120, "a rank of two live gloo ranks never left the barrier")
        results[rank] = (kind, payload)
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    return results


def test_two_gloo_ranks_meet():
    results = _run(timeout_s=20)
    assert results[0] == ("ok", True) and results[1] == ("ok", True)


def _regroup_worker(rank: int, store_dir: str, out) -> None:
    import torch.distributed as dist

    from colo_fsm.guards.fingerprint import HandoffFingerprint

    try:
        dist.init_process_group("gloo", init_method=f"file://{store_dir}/first", rank=rank, world_size=2)
        barrier = TorchBarrier(timeout_s=20)
        barrier.wait(state="Draining", weight_version=1, fingerprint=HandoffFingerprint("Draining", 1, 1))
        held = barrier._last_work is not None
        groups = [k for k, v in vars(barrier).items() if isinstance(v, dist.ProcessGroup)]
        dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=f"file://{store_dir}/second", rank=rank, world_size=2)
        barrier.wait(state="Draining", weight_version=2, fingerprint=HandoffFingerprint("Draining", 2, 2))
        barrier.wait(state="Draining", weight_version=2)
        dist.destroy_process_group()
        out.put((rank, "ok", held, groups))
    except Exception as exc:  # reported to the test, which names it
        out.put((rank, "error", repr(exc), None))


def test_the_barrier_holds_its_last_exchange_and_not_the_default_group(tmp_path):
    """The fingerprint exchange's work handles stay with the barrier until the next exchange, so that this
    thread, not a gloo thread, releases them last (that release takes the GIL, which aborts the process when it
    lands in interpreter shutdown: "terminate called without an active exception", seen in about one 2-rank run
    of eight before). The default group is looked up per call, so ``destroy_process_group`` really ends it and a
    barrier built before a re-init works on the new group."""
    ctx = rank_context()
    out = ctx.Queue()
    procs = [ctx.Process(target=_regroup_worker, args=(r, str(tmp_path), out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = [get_or_fail(out, 120, "a gloo worker never reported") for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for rank, kind, held, groups in results:
        assert kind == "ok", (rank, held)
        assert held, (
            f"rank {rank}: the barrier dropped the exchange's work handles: a gloo thread may release them last"
        )
        assert groups == [], f"rank {rank}: the barrier holds the default process group in {groups}"


# A live but silent peer: its process stays up (blocked on an event the test sets only after it has seen the
# other rank's outcome), so nothing but the barrier's own deadline can end the wait. One spawn runs every case,
# each on a group of its own (a timed-out group is broken for good).
SILENT_CASES = (("fingerprint", 1), ("fingerprint", 0), ("plain", 1), ("plain", 0))
DEADLINE_S = 1.0
SLACK_S = 6.0  # generous for a busy 2-core machine; a barrier that waits for the process group's 120 s fails


def _silent_peer_worker(rank: int, port: int, out, releases) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from colo_fsm.guards.fingerprint import HandoffFingerprint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    try:
        for i, (kind, silent) in enumerate(SILENT_CASES):
            barrier = TorchBarrier(dist.new_group([0, 1]), timeout_s=DEADLINE_S)
            fp = HandoffFingerprint("Draining", 0, 7) if kind == "fingerprint" else None
            if rank == silent:
                out.put((i, rank, "alive", None))
                releases[i].wait(300)  # alive, silent: arrives only after the test saw its peer's outcome
            else:
                out.put((i, rank, "arrived", None))
            try:
                barrier.wait(state="Draining", weight_version=7, fingerprint=fp)
                out.put((i, rank, "passed", None))
            except BarrierTimeout as exc:
                out.put((i, rank, "timeout", (str(exc), exc.state, exc.rank, exc.timeout_s)))
    finally:
        dist.destroy_process_group()


class _Inbox:
    """Messages of the workers by ``(case, rank)``, each awaited with a bound (an assertion, never a hang)."""

    def __init__(self, queue) -> None:
        self.queue = queue
        self.seen: dict[tuple[int, int], tuple[str, object]] = {}

    def expect(self, case: int, rank: int, within_s: float, what: str) -> tuple[str, object]:
        import queue as queue_mod
        import time

        end = time.monotonic() + within_s
        while (case, rank) not in self.seen:
            try:
                i, r, kind, payload = self.queue.get(timeout=max(end - time.monotonic(), 0.01))
            except queue_mod.Empty:
                pytest.fail(f"case {SILENT_CASES[case]}: rank {rank} sent nothing within {within_s:g}s ({what})")
            self.seen[(i, r)] = (kind, payload)
        return self.seen.pop((case, rank))


def test_a_live_silent_peer_times_out_at_the_barriers_own_deadline():
    """Plain and fingerprint barriers, absent rank 1 and rank 0: the waiting rank raises BarrierTimeout within
    the deadline + slack of arriving, naming state, rank and timeout; the late rank fails too (gloo closed
    the connections at the deadline) instead of passing on its peer's abandoned contribution."""
    ctx = rank_context()
    out = ctx.Queue()
    releases = [ctx.Event() for _ in SILENT_CASES]
    port = _free_port()
    procs = [ctx.Process(target=_silent_peer_worker, args=(r, port, out, releases)) for r in range(2)]
    for p in procs:
        p.start()
    inbox = _Inbox(out)
    try:
        for i, (kind, silent) in enumerate(SILENT_CASES):
            waiting = 1 - silent
            assert inbox.expect(i, silent, 120, "start")[0] == "alive"
            assert inbox.expect(i, waiting, 120, "start")[0] == "arrived"
            outcome, payload = inbox.expect(
                i, waiting, DEADLINE_S + SLACK_S, f"a {DEADLINE_S:g}s barrier must give up while its peer is alive"
            )
            assert outcome == "timeout", (kind, silent, outcome)
            msg, state, rank, timeout_s = payload
            assert (state, rank, timeout_s) == ("Draining", waiting, DEADLINE_S), payload
            assert msg.startswith(f"barrier timed out after {DEADLINE_S:g}s") and f"rank={waiting}" in msg, msg
            releases[i].set()
            late, late_payload = inbox.expect(i, silent, DEADLINE_S + SLACK_S, "the late rank must not hang")
            # its peer gave up: the late rank must not pass on the peer's abandoned contribution
            assert late == "timeout", (kind, silent, late)
            assert late_payload[2] == silent
    finally:
        for e in releases:
            e.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def test_thread_barrier_times_out_with_context():
    shared = threading.Barrier(2)
    b = ThreadBarrier(shared, rank=1, timeout_s=0.2)
    with pytest.raises(BarrierTimeout) as info:
        b.wait(state="Waking", weight_version=3)
    assert info.value.state == "Waking" and info.value.rank == 1 and info.value.weight_version == 3


def test_solo_barrier_returns():
    assert SoloBarrier().wait(state="Draining") is None


@pytest.mark.parametrize("bad", [0, -1, "10", True])
def test_bad_timeouts(bad):
    with pytest.raises(ConfigError, match="barrier_timeout_s"):
        ThreadBarrier(threading.Barrier(1), rank=0, timeout_s=bad)


def test_torch_barrier_needs_a_process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(ConfigError, match="process_group"):
        TorchBarrier()
