"""Cost of the fingerprint barrier against a plain barrier, per handoff: gloo over 2 and 4 ranks, NCCL world 1.

Each rank is a real process in one ``torch.distributed`` group. Four ways to meet, interleaved in one run
(the order rotates every round, so machine load hits all of them alike):

* ``plain``: :class:`~colo_fsm.guards.barrier.TorchBarrier` without a fingerprint (a ``barrier`` work
  carrying the deadline as its own timeout);
* ``dist.barrier``: torch's bare barrier, for reference;
* ``monitored_barrier``: gloo's ``monitored_barrier``, the handoff barrier before (it overstays its timeout
  on a non-zero rank while a live rank 0 stays silent, so ``TorchBarrier`` no longer uses it);
* ``fingerprint``: the same ``TorchBarrier`` exchanging a :class:`~colo_fsm.guards.fingerprint.HandoffFingerprint`
  (one int64 per declared field per rank to every rank: point-to-point messages on gloo, an all_gather on NCCL),
  *including* building the fingerprint from a mode report and its digest and checking the gathered rows,
  i.e. everything the lifecycle's barrier action adds;
* ``local work``: the fingerprint path without communication (build, encode, decode, check), timed alone:
  the part of the cost that is not message latency.

Every handoff is timed on its own (rank 0's clock), so a process preempted in the middle of one handoff costs
that one sample, not the mean of its block: on a shared machine a barrier of ~0.3 ms sometimes waits a whole
scheduler slice for the other rank, and a block's mean moved by 2x with it. Reported: rank 0's median
microseconds per handoff for each kind over every round, and fingerprint / plain as the median (with quartiles
and range) of the per-round ratios of medians (the kinds of one round run back to back, so load drift between
rounds cancels), next to the ratio of the overall medians. Each rank's torch uses one thread (the exchange is
a few int64s; idle intra-op threads only compete for the cores), and each rank is pinned to one core (rank r on
core r mod cores, with the threads it starts, gloo's among them; ``--no-pin`` to let the scheduler move them):
on a shared 2-core machine the unpinned ratio moved from run to run about twice as much. Target: the
fingerprint adds at most 20% to a plain gloo barrier.

The default run measures gloo at 2 and 4 ranks, then an NCCL section at world 1 on the first GPU (skipped,
with a message, where no CUDA device is visible); every row goes to one JSON file.

Usage::

    python bench/fingerprint_barrier.py                    # gloo 2 and 4 ranks, then NCCL world 1 if a GPU
    python bench/fingerprint_barrier.py --quick
    python bench/fingerprint_barrier.py --backend nccl --ranks 2 4 8   # NCCL only, one GPU per rank
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)

KINDS = ("plain", "dist.barrier", "monitored_barrier", "fingerprint")
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs (the default gloo rows)
    "gloo 2 ranks: fingerprint / plain": "rows.0.ratio_fingerprint_vs_plain",
    "gloo 2 ranks: plain us": "rows.0.median_us.plain",
    "gloo 2 ranks: fingerprint us": "rows.0.median_us.fingerprint",
    "gloo 4 ranks: fingerprint / plain": "rows.1.ratio_fingerprint_vs_plain",
    "gloo 4 ranks: plain us": "rows.1.median_us.plain",
    "gloo 4 ranks: fingerprint us": "rows.1.median_us.fingerprint",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int, world: int, port: int, backend: str, rounds: int, iters: int, out: Any, pin: bool = False
) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from colo_fsm.guards.barrier import TorchBarrier
    from colo_fsm.guards.fingerprint import HandoffFingerprint, divergence
    from colo_fsm.guards.mode import ModelMode, ModeReport, mode_digest
    from colo_fsm.guards.sampling import SamplingStream

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    if pin and hasattr(os, "sched_setaffinity"):  # rank r on core r mod cores: no migration mid-handoff
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kwargs["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=120), **kwargs)
    barrier = TorchBarrier(timeout_s=120)
    report = ModeReport(ModelMode(expert_padding=False, inference_dispatchers=0), ModelMode(expert_padding=False))

    def plain() -> None:
        barrier.wait(state="Draining", weight_version=3)

    def monitored() -> None:  # the handoff barrier before (gloo only; it overstays its timeout, see docs)
        if backend == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=120), wait_all_ranks=True)
        else:
            bare()

    def bare() -> None:
        dist.barrier()
        if backend == "nccl":
            torch.cuda.synchronize(rank)

    stream = SamplingStream(base_seed=1234, dp_rank=rank)

    def build() -> HandoffFingerprint:  # what Lifecycle._fingerprint does at a barrier
        return HandoffFingerprint(
            state="Draining", step=3, weight_version=3, save=False, validate=True, last=False,
            mode_digest=mode_digest(report), dp_rank=stream.dp_rank, sampling_seed=stream.seed, mode=report,
        )  # fmt: skip

    def fingerprint() -> None:
        barrier.wait(state="Draining", weight_version=3, fingerprint=build())

    def local_only() -> None:  # the fingerprint path without its communication: build, encode, decode, check
        fp = build()
        flat = torch.tensor(fp.to_ints() * world, dtype=torch.int64).tolist()
        n = len(fp.to_ints())
        rows = [HandoffFingerprint.from_ints(flat[i * n : (i + 1) * n]) for i in range(world)]
        rows = [dataclasses.replace(r, dp_rank=i, sampling_seed=r.sampling_seed + i) for i, r in enumerate(rows)]
        divergence(rows, rank=rank)

    fns = {"plain": plain, "dist.barrier": bare, "monitored_barrier": monitored, "fingerprint": fingerprint}
    for fn in fns.values():  # warm up every path (and NCCL's communicators)
        for _ in range(max(5, iters // 10)):
            fn()
    clock = time.perf_counter
    samples: dict[str, list[list[float]]] = {k: [] for k in KINDS}  # per kind, per round: each handoff's us
    for r in range(rounds):
        order = KINDS[r % len(KINDS) :] + KINDS[: r % len(KINDS)]
        for kind in order:
            fn = fns[kind]
            dist.barrier()
            times = []
            for _ in range(iters):
                t0 = clock()
                fn()
                times.append((clock() - t0) * 1e6)
            samples[kind].append(times)
    local = []
    for _ in range(iters * 4):
        t0 = clock()
        local_only()
        local.append((clock() - t0) * 1e6)
    samples["local_only"] = [local]
    out.put((rank, samples))
    dist.barrier()
    dist.destroy_process_group()


def run(world: int, backend: str, rounds: int, iters: int, pin: bool = False) -> dict[str, object]:
    import torch.multiprocessing as mp

    load_before = os.getloadavg()[0]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, backend, rounds, iters, out, pin)) for r in range(world)]
    for p in procs:
        p.start()
    per_rank = {}
    for _ in range(world):
        rank, samples = out.get(timeout=600)
        per_rank[rank] = samples
    for p in procs:
        p.join(timeout=60)
    s0 = per_rank[0]
    every = {k: [t for block in v for t in block] for k, v in s0.items()}
    med = {k: statistics.median(v) for k, v in every.items()}
    # paired by round (the kinds ran back to back): load drift between rounds cancels out of the ratio
    paired = sorted(
        statistics.median(f) / statistics.median(p) for f, p in zip(s0["fingerprint"], s0["plain"], strict=True)
    )
    q = statistics.quantiles(paired, n=4) if len(paired) >= 2 else [paired[0]] * 3
    return {
        "ranks": world,
        "backend": backend,
        "median_us": med,
        "p25_us": {k: _quartiles(v)[0] for k, v in every.items()},
        "p75_us": {k: _quartiles(v)[1] for k, v in every.items()},
        "min_us": {k: min(v) for k, v in every.items()},
        "max_us": {k: max(v) for k, v in every.items()},
        "ratio_fingerprint_vs_plain": statistics.median(paired),
        "ratio_fingerprint_vs_plain_quartiles": [q[0], q[2]],
        "ratio_fingerprint_vs_plain_range": [paired[0], paired[-1]],
        "ratio_of_medians_fingerprint_vs_plain": med["fingerprint"] / med["plain"],
        "ratio_fingerprint_vs_dist_barrier": med["fingerprint"] / med["dist.barrier"],
        "ratio_fingerprint_vs_monitored_barrier": med["fingerprint"] / med["monitored_barrier"],
        "fingerprint_local_us": med["local_only"],
        "rounds": rounds,
        "iters_per_round": iters,
        "pinned": pin,
        "loadavg_1min_before_after": [load_before, os.getloadavg()[0]],
    }


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| backend | ranks | plain TorchBarrier us | dist.barrier us | monitored_barrier us | fingerprint barrier us |"
        " fingerprint / plain (per-round median; IQR; range) | ratio of the medians |"
        " fingerprint / monitored_barrier | fingerprint's local work us |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, iqr, rng = r["median_us"], r["ratio_fingerprint_vs_plain_quartiles"], r["ratio_fingerprint_vs_plain_range"]
        assert isinstance(m, dict) and isinstance(iqr, list) and isinstance(rng, list)
        lines.append(
            f"| {r['backend']} | {r['ranks']} | {m['plain']:.0f} | {m['dist.barrier']:.0f} "
            f"| {m['monitored_barrier']:.0f} | {m['fingerprint']:.0f} "
            f"| {r['ratio_fingerprint_vs_plain']:.2f} ({iqr[0]:.2f}-{iqr[1]:.2f}; {rng[0]:.2f}-{rng[1]:.2f}) "
            f"| {r['ratio_of_medians_fingerprint_vs_plain']:.2f} "
            f"| {r['ratio_fingerprint_vs_monitored_barrier']:.2f} | {r['fingerprint_local_us']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="one backend only (default: both)")
    ap.add_argument("--ranks", type=int, nargs="+", default=None, help="gloo default 2 4; NCCL default 1")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--iters", type=int, default=50, help="handoffs per kind per round")
    ap.add_argument("--quick", action="store_true", help="8 rounds of 25")
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin rank r (and the threads it starts) to core r mod cores (Linux; default on)",
    )
    ap.add_argument("--json", type=Path, default=None, help="default bench/results/fingerprint_barrier[_nccl].json")
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    if args.quick:
        args.rounds, args.iters = 8, 25
    sections = [("gloo", args.ranks or [2, 4]), ("nccl", args.ranks or [1])]
    if args.backend is not None:
        sections = [s for s in sections if s[0] == args.backend]
    rows: list[dict[str, object]] = []
    skipped: list[str] = []
    for backend, ranks in sections:
        if backend == "nccl":
            import torch

            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            usable = [n for n in ranks if n <= have]
            if not usable:
                why = f"NCCL section skipped: it needs a GPU per rank ({ranks} ranks), {have} CUDA device(s) visible"
                print(why)
                skipped.append(why)
                continue
            ranks = usable
        rows += [run(n, backend, args.rounds, args.iters, args.pin) for n in ranks]
    if rows:
        print(table(rows))
    only_nccl = args.backend == "nccl"
    path = args.json or ROOT / "bench" / "results" / f"fingerprint_barrier{'_nccl' if only_nccl else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    meta: dict[str, object] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        meta["loadavg"] = list(os.getloadavg())
    except OSError:
        pass
    if skipped:
        meta["skipped"] = skipped
    path.write_text(json.dumps({"provenance": prov, "meta": meta, "rows": rows}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
