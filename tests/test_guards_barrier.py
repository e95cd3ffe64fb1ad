"""Barrier with a timeout: real gloo processes on the CPU, one of which never arrives."""

import os
import socket
import threading

import pytest
import torch.multiprocessing as mp

from colo_fsm.errors import BarrierTimeout, ConfigError
from colo_fsm.guards.barrier import SoloBarrier, ThreadBarrier, TorchBarrier
from colo_fsm.guards.decision import LatchedDecision, broadcast_from_rank0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, absent_rank: int, timeout_s: float, out) -> None:
    import time
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        barrier = TorchBarrier(timeout_s=timeout_s)
        if rank == absent_rank:
            time.sleep(timeout_s * 4)  # never arrives in time
            out.put((rank, "absent", None))
            return
        t0 = time.monotonic()
        try:
            barrier.wait(state="Draining", weight_version=7)
            # ranks whose clocks disagree still latch one decision: rank 0's
            agreed = LatchedDecision("save", lambda step: rank == 0, agree=broadcast_from_rank0()).decide(0)
            out.put((rank, "ok", agreed))
        except BarrierTimeout as exc:
            out.put((rank, "timeout", (str(exc), exc.state, exc.rank, exc.timeout_s, time.monotonic() - t0)))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _run(absent_rank: int, timeout_s: float):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, absent_rank, timeout_s, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(2):
        rank, kind, payload = out.get(timeout=120)
        results[rank] = (kind, payload)
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    return results


def test_two_gloo_ranks_meet():
    results = _run(absent_rank=-1, timeout_s=20)
    assert results[0] == ("ok", True) and results[1] == ("ok", True)


@pytest.mark.parametrize("absent", [1, 0])
def test_absent_rank_times_out_naming_state_rank_and_timeout(absent):
    """gloo's monitored barrier treats rank 0 differently: an absent rank 0 must time out the others too."""
    results = _run(absent_rank=absent, timeout_s=2.0)
    present = 1 - absent
    kind, payload = results[present]
    assert kind == "timeout", results
    msg, state, rank, timeout_s, waited = payload
    assert state == "Draining" and rank == present and timeout_s == 2.0
    assert "Draining" in msg and f"rank={present}" in msg and "2s" in msg
    assert waited < 15, "the barrier must give up near its timeout, not hang"


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
