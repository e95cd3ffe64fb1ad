"""Measured GPU memory of a colocated run (a KV buffer of a given size plus train steps), with its config.

Runs the ``colocated`` role of ``colocated_vs_dedicated.py`` in this process: the GPT with ``MegatronTrainer``
(megatron-core's DDP and optimizer on CUDA), two train steps, the dynamic engine up (KV buffer of
``--buffer-gb``), decode, the engine suspended for two more train steps, resumed. Records phase snapshots,
``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()`` and ``mem_get_info`` with everything a
memory-budget estimate takes as input (parameters, dtypes, optimizer, KV buffer, train batch shape), and
colo-fsm's own budget for the run (``colo_fsm.guards.memory``) without its margin over the measured peak
(``estimate_over_peak``). A failed section makes it exit 1.

    python bench/memory_peak.py --graphs off --buffer-gb 8 --out bench/results/memory_peak.json   # GPU, ~30 s
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository, for bench.* and colo_fsm
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _gpu as g  # noqa: E402
from bench import colocated_vs_dedicated as cvd  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """This bench's command line: the colocated role's settings, with its defaults (eager, an 8 GiB buffer)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/memory_peak.json")
    ap.add_argument("--graphs", default="off", choices=("on", "off"))
    ap.add_argument("--scope", default="layer", choices=("layer", "block"), help="inference_cuda_graph_scope")
    ap.add_argument("--buffer-gb", type=float, default=8.0)
    ap.add_argument("--batches", default="16")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--num-cuda-graphs", type=int, default=16)
    ap.add_argument("--max-requests", type=int, default=64)
    return ap


def role_args(argv: list[str] | None) -> argparse.Namespace:
    """``argv`` as the colocated role of ``colocated_vs_dedicated.py`` takes it (two train steps, no weights
    written), checked as that bench checks it: graph options with ``--graphs off`` are refused, not ignored."""
    ap = build_parser()
    args = ap.parse_args(argv)
    given = cvd.given_options(ap, argv)  # a graph option given with --graphs off goes on, for the role to refuse
    graphs = [
        part
        for dest in cvd.GRAPH_OPTIONS
        if args.graphs == "on" or dest in given
        for part in (f"--{dest.replace('_', '-')}", str(getattr(args, dest)))
    ]
    return cvd.parse(
        [
            *("--role", "colocated", "--out", args.out, "--graphs", args.graphs, *graphs),
            *("--buffer-gb", str(args.buffer_gb), "--batches", args.batches, "--steps", str(args.steps)),
            *("--max-requests", str(args.max_requests)),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = role_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("memory_peak: needs a GPU (megatron-core's dynamic engine); nothing measured here")
        return 0
    data = cvd.run_role(args)
    mem = data.get("sections", {}).get("memory", {})
    rows = [
        {
            "phase": p["tag"],
            "allocated GiB": p["allocated_gib"],
            "reserved GiB": p["reserved_gib"],
            "peak allocated GiB": p["max_allocated_gib"],
            "device used GiB": p["device_used_gib"],
        }
        for p in data.get("sections", {}).get("memory_phases", [])
    ]
    print(g.table(rows, ["phase", "allocated GiB", "reserved GiB", "peak allocated GiB", "device used GiB"]))
    print("config:", mem.get("config"))
    print("peak allocated GiB:", mem.get("peak_allocated_gib"), "peak reserved GiB:", mem.get("peak_reserved_gib"))
    est = mem.get("estimate")
    if est:
        print(
            f"colo-fsm's memory budget without its margin: {est['without_margin_gib']:.3f} GiB, "
            f"{mem['estimate_over_peak']:.4f}x the measured peak (breakdown: "
            + ", ".join(f"{k}={v:.3f}" for k, v in est.items() if k != "without_margin_gib")
            + ")"
        )
    print(f"wrote {args.out}")
    return g.failed_sections(data)


if __name__ == "__main__":
    sys.exit(main())
