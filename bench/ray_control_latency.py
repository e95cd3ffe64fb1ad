"""Control-call latency on a Ray worker actor saturated with rollout calls, with vs without a control group.

Two worker actors run side by side in one Ray session: ``RolloutWorker`` (control calls in their own
``"control"`` concurrency group) and ``RolloutWorkerOneQueue`` (everything in the default queue). Each gets
more rollout calls than it runs at once (``max_concurrency`` = 1000, Ray's asyncio default), each rollout
holding ``--hold`` seconds, so some queue. Then control calls (``ping``) are issued every 20 ms without waiting
for the previous one, and each is timed from submission to completion. A second measurement issues one
``suspend`` into the same saturation (it waits for running rollouts by design) and checks that nothing ran
while suspended and no rollout was lost. A third suspends the engine, sends the same number of rollout calls
(1000 of them wait at the closed gate, holding every default-group slot; the rest queue) and times a
training step's calls (``restore_buffers``, ``train_step``, ``offload_buffers``), which are control calls of
the colocated worker. In the shared queue they wait until the parked rollouts give up (the one-queue
worker's request timeout is set to three hold times, longer than any wait of the suspend measurement, so
they do; by default they would wait 300 s).

Usage::

    python bench/ray_control_latency.py           # 1500 rollouts, hold 3 s, 50 control calls (~70 s)
    python bench/ray_control_latency.py --quick   # 1200 rollouts, hold 2 s, 30 control calls (~55 s)

Writes ``bench/results/ray_control_latency.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tests.support (the saturation harness) lives in the repository, not the package
    sys.path.insert(0, str(ROOT))
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)

RESULTS = ROOT / "bench" / "results" / "ray_control_latency.json"
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "one queue / separate group, p50": "ratio_p50",
    "one queue / separate group, p99": "ratio_p99",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller run (about 35 s)")
    ap.add_argument("--rollouts", type=int, default=None, help="rollout calls submitted per actor")
    ap.add_argument("--hold", type=float, default=None, help="seconds each rollout call holds")
    ap.add_argument("--control-calls", type=int, default=None, help="control calls per actor")
    ap.add_argument("--max-concurrency", type=int, default=1000, help="actor max_concurrency (default group)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    rollouts = args.rollouts or (1200 if args.quick else 1500)
    hold = args.hold or (2.0 if args.quick else 3.0)
    n_control = args.control_calls or (30 if args.quick else 50)
    if rollouts <= args.max_concurrency:
        print(f"--rollouts must exceed --max-concurrency={args.max_concurrency} to saturate the actor")
        return 2

    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    import ray

    from colo_fsm.ray import init_ray, make_worker_class
    from colo_fsm.ray.fakes import HoldingWorkerFactory
    from tests.support.saturation import measure_control_latency, measure_suspend, measure_training_step

    t_start = time.monotonic()
    init_ray(num_cpus=2)
    kinds = {
        "separate control group": (make_worker_class(max_concurrency=args.max_concurrency), True),
        "one shared queue": (
            make_worker_class(separate_control_group=False, max_concurrency=args.max_concurrency),
            False,
        ),
    }
    workers = {
        label: cls.remote(i, HoldingWorkerFactory(hold), request_timeout_s=300.0 if grouped else 3 * hold)
        for i, (label, (cls, grouped)) in enumerate(kinds.items())
    }
    ray.get([w.bring_up.remote() for w in workers.values()])

    results = {}
    training = {}
    for label, worker in workers.items():
        r = measure_control_latency(
            worker,
            label=label,
            rollout_calls=rollouts,
            max_concurrency=args.max_concurrency,
            hold_s=hold,
            control_calls=n_control,
            probe_active=kinds[label][1],
        )
        s = measure_suspend(worker, label=label, rollout_calls=rollouts, hold_s=hold)
        t = measure_training_step(
            worker,
            [f"sample{i}" for i in range(8)],
            label=label,
            rollout_calls=rollouts,
            probe_parked=args.max_concurrency if kinds[label][1] else None,
        )
        results[label] = (r, s)
        training[label] = t
    ray.shutdown()

    with_g, without = results["separate control group"][0], results["one shared queue"][0]
    print(
        f"\nRay control-call latency, actor saturated: {rollouts} rollout calls in flight "
        f"(max_concurrency={args.max_concurrency}, each holds {hold:g} s), {n_control} ping calls 20 ms apart\n"
    )
    print("| control calls | n | p50 ms | p99 ms | max ms | rollouts completed |")
    print("|---|---|---|---|---|---|")
    for label, (r, _) in results.items():
        print(
            f"| {label} | {len(r.latencies_s)} | {r.p50 * 1e3:.1f} | {r.p99 * 1e3:.1f} | "
            f"{max(r.latencies_s) * 1e3:.1f} | {r.completed_rollouts}/{rollouts} |"
        )
    ratio50, ratio99 = without.p50 / with_g.p50, without.p99 / with_g.p99
    print(f"\nratio (one queue / separate group): p50 {ratio50:.0f}x, p99 {ratio99:.0f}x")
    print("\n| suspend under saturation | suspend s | running after | waiting at gate | rollouts ok | failed |")
    print("|---|---|---|---|---|---|")
    for label, (_, s) in results.items():
        print(
            f"| {label} | {s.suspend_s:.2f} | {s.active_after_suspend} | {s.waiting_at_gate} | "
            f"{s.rollouts_ok}/{s.rollout_calls} | {s.rollouts_failed} |"
        )
    print(
        "\n| training step, suspended, rollouts waiting | restore ms | train_step ms | offload ms | step ms "
        "| rollouts ok | gave up at the gate |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, t in training.items():
        lat = t.latencies_s
        print(
            f"| {label} | {lat['restore_buffers'] * 1e3:.1f} | {lat['train_step'] * 1e3:.1f} | "
            f"{lat['offload_buffers'] * 1e3:.1f} | {t.step_s * 1e3:.1f} | {t.rollouts_ok}/{t.rollout_calls} | "
            f"{t.rollouts_failed} |"
        )

    payload = {
        "provenance": prov,
        "benchmark": "ray_control_latency",
        "config": {
            "rollout_calls": rollouts,
            "hold_s": hold,
            "control_calls": n_control,
            "interval_s": 0.02,
            "max_concurrency": args.max_concurrency,
            "ray_num_cpus": 2,
        },
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "ray": ray.__version__,
            "loadavg": os.getloadavg(),
        },
        "control_latency": {label: r.summary() for label, (r, _) in results.items()},
        "latencies_ms": {label: [round(x * 1e3, 3) for x in r.latencies_s] for label, (r, _) in results.items()},
        "ratio_p50": ratio50,
        "ratio_p99": ratio99,
        "suspend": {label: s.__dict__ for label, (_, s) in results.items()},
        "training_step": {label: t.summary() for label, t in training.items()},
        "wall_s": time.monotonic() - t_start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    t_g, t_q = training["separate control group"], training["one shared queue"]
    ok = (
        with_g.p99 < without.p50
        and all(s.rollouts_failed == 0 for _, s in results.values())
        and t_g.step_s < t_q.step_s
        and t_g.rollouts_failed == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
