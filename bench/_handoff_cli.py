"""The handoff bench's command line (``bench/inflight_handoff.py``): its options, what each is checked against, and
the run's shape they give (model + workload + overrides); one job, so the bench's runner stays the runner."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bench._graph_baseline import graph_contexts, graph_loop_batches, graph_only_refusal
from bench._handoff import DRAIN_RACES, ENGINES, MIN_STEPS, REASONING, SMOKE
from bench._workload import MODELS, QUICK, Shape
from colo_fsm.collector.batch_order import ORDERS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "inflight_handoff.json"
"""Where a run's JSON goes by default (its name says the workload, model, cut and age)."""
MODES = ("park", "drain", "sync", "abort", "drain-hold")
DEFAULT_MODES = ("park", "drain", "sync", "abort")
DESCRIPTION = (
    "Park vs drain vs sync vs abort: what a handoff that keeps in-flight rollouts is worth, with heavy-tailed lengths."
)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, str, Shape, list[str]]:
    """The command line: arguments, model name, the run's shape (model + workload + overrides), modes."""
    ap = argparse.ArgumentParser(
        prog="bench/inflight_handoff.py", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="cpu (default) or cuda (reasoning: cuda)")
    ap.add_argument("--model", choices=sorted(MODELS), default=None, help="small (CPU default), gpt200m, gpt1b")
    ap.add_argument(
        "--workload",
        choices=("default", "reasoning"),
        default="default",
        help="reasoning: lognormal(768, 1.0) cut at --max-len, 32x8 per step, 256 active, 40 GiB KV, graphs",
    )
    ap.add_argument("--smoke", action="store_true", help="with --workload reasoning: tiny model on the CPU, seconds")
    ap.add_argument(
        "--engine", choices=sorted(ENGINES), default=None, help="how the engine is built (default: direct)"
    )  # None until read, so --graph-only refuses it even when given as the default
    ap.add_argument("--quick", action="store_true", help="fewer steps (under 3 min on 2 CPU cores)")
    ap.add_argument("--modes", default=None, help=f"comma-separated subset of {','.join(MODES)} (default: all)")
    ap.add_argument(
        "--steps", type=int, default=None, help=f"measured steps per mode (a ratio needs {MIN_STEPS} or more)"
    )
    ap.add_argument(
        "--warmup", type=int, default=None, help="steps before them in park, drain and abort (sync needs none)"
    )
    ap.add_argument("--max-tokens", "--max-len", dest="max_tokens", type=int, default=None, help="output-length cut")
    ap.add_argument("--median-tokens", type=float, default=None)
    ap.add_argument("--sigma", type=float, default=None)
    ap.add_argument("--num-prompts-per-step", type=int, default=None)
    ap.add_argument("--samples-per-group", type=int, default=None)
    ap.add_argument("--max-age", type=int, default=None, help="max_trajectory_age_steps")
    ap.add_argument("--max-active", type=int, default=None, help="the engine's max_active_requests")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (small: 0, gpt200m: 1)")
    ap.add_argument("--micro-batch-tokens", type=int, default=None, help="the trainer's padded tokens per micro-batch")
    ap.add_argument(
        "--mode-budget-s", type=float, default=None, help="seconds per mode: stop before a step that would overrun it"
    )
    ap.add_argument(
        "--rounds", type=int, default=None, help="rounds of the modes, interleaved (default 3; --quick 4; reasoning 1)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    ap.add_argument(
        "--sample-timeout", type=float, default=None, help="seconds the trainer waits on the buffer (default 600)"
    )
    ap.add_argument(
        "--out", default=None, help="JSON path (default bench/results/inflight_handoff[_reasoning...].json)"
    )
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--cuda-graphs",
        type=int,
        default=None,
        metavar="N",
        help="CUDA-graph decode (GPU): ModelConfig(cuda_graphs=True), GenerationConfig(num_cuda_graphs=N)",
    )
    ap.add_argument(
        "--graph-sizing",
        choices=("default", "exponential", "linear"),
        default="default",
        help="which decode batches megatron captures (GenerationConfig/CoordinatorConfig cuda_graph_sizing, for the "
        "run and its graph-decode baseline): default (megatron's own, left unset), exponential (powers of two, "
        "megatron's default named) or linear (every max_active/N requests); other than default, needs CUDA graphs",
    )
    ap.add_argument(
        "--ep-consensus-interval",
        type=int,
        default=None,
        metavar="N",
        help="--engine coordinator: megatron's loop checks for a pause every N iterations while it has work "
        "(CoordinatorConfig.ep_consensus_interval; default colo-fsm's: 1 at expert parallelism 1; megatron's own "
        "is 20)",
    )
    ap.add_argument("--buffer-gb", type=float, default=None, help="KV buffer of the dynamic engine (GiB; default 1)")
    ap.add_argument("--no-graph-baseline", action="store_true", help="skip the pure graph-decode baseline")
    ap.add_argument(
        "--graph-contexts",
        default=None,
        help="comma-separated contexts (tokens) the graph-decode baseline also runs from, each at the batches that "
        "fit the KV buffer (GPU with CUDA graphs, the baseline on)",
    )
    ap.add_argument(
        "--graph-loop-costs",
        default=None,
        metavar="BATCHES",
        help="comma-separated batches (e.g. 25,40,65,120): the graph-decode baseline also times, from the workload's "
        "mean context, what makes a loop's decode step differ from it: these batches between the captured graphs' "
        "sizes, log-probs, each request at its own context, and all three (GPU with CUDA graphs, the baseline on; "
        "an empty value: none)",
    )
    ap.add_argument(
        "--graph-only",
        action="store_true",
        help="the graph-decode baseline alone (and its --graph-contexts), no mode: a JSON of benchmark graph_decode, "
        "which the performance page does not count as a handoff run (on the CPU it writes that none ran)",
    )
    ap.add_argument(
        "--drain-race",
        choices=DRAIN_RACES,
        default=None,  # "free" once read (as --engine's default)
        help="drain's race after each resume: free (default: either thread may go first) or collector-first (each "
        "handoff waits until the collector has started every rollout it may)",
    )
    ap.add_argument(
        "--buffer-order",
        choices=ORDERS,
        default=None,
        help="which groups a step trains on: the oldest reservations (start, default) or what must go now plus "
        "what is finished (deadline: no head-of-line blocking)",
    )
    args = ap.parse_args(argv)
    if args.graph_only and (why := graph_only_refusal(args)):
        ap.error(why)
    args.engine = args.engine or "direct"
    args.drain_race = args.drain_race or "free"
    if args.sample_timeout is None:
        args.sample_timeout = 600.0
    reasoning = args.workload == "reasoning"
    if args.smoke and not reasoning:
        ap.error("--smoke goes with --workload reasoning")
    if args.device is None:
        args.device = "cuda" if reasoning and not args.smoke else "cpu"
    model_name = args.model or ("gpt200m" if args.device == "cuda" else "small")
    shape = MODELS[model_name]
    if reasoning:
        shape = replace(shape, **(SMOKE if args.smoke else REASONING))
        if args.buffer_gb is None and not args.smoke:
            args.buffer_gb = 40.0
        if args.cuda_graphs is None and args.device == "cuda":
            args.cuda_graphs = 16
        args.rounds = args.rounds or 1
    if args.buffer_gb is None:
        args.buffer_gb = 1.0
    if args.ep_consensus_interval is not None and args.engine != "coordinator":
        ap.error(f"--ep-consensus-interval {args.ep_consensus_interval}: only megatron's coordinator loop takes a "
                 f"pause consensus; it needs --engine coordinator (not {args.engine})")  # fmt: skip
    if args.ep_consensus_interval is not None and args.ep_consensus_interval < 1:
        ap.error(f"--ep-consensus-interval {args.ep_consensus_interval}: a positive number of loop iterations")
    args.graph_sizing = None if args.graph_sizing == "default" else args.graph_sizing
    if args.graph_sizing is not None and (args.device != "cuda" or args.cuda_graphs is None):
        ap.error(f"--graph-sizing {args.graph_sizing} sizes CUDA graphs: it needs --device cuda with --cuda-graphs N")
    if args.graph_only and args.device == "cuda" and args.cuda_graphs is None:
        ap.error("--graph-only on the GPU times the CUDA-graph decode: give --cuda-graphs N (reasoning: 16 by default)")
    if args.quick:
        shape = replace(shape, **QUICK[model_name])
    overrides = {
        "steps": args.steps,
        "warmup": args.warmup,
        "max_tokens": args.max_tokens,
        "median_tokens": args.median_tokens,
        "sigma": args.sigma,
        "num_prompts_per_step": args.num_prompts_per_step,
        "samples_per_group": args.samples_per_group,
        "max_trajectory_age_steps": args.max_age,
        "max_active_requests": args.max_active,
        "temperature": args.temperature,
        "micro_batch_tokens": args.micro_batch_tokens,
        "buffer_order": args.buffer_order,
    }
    shape = replace(shape, **{k: v for k, v in overrides.items() if v is not None})
    modes = (
        [] if args.graph_only else [m.strip() for m in (args.modes or ",".join(DEFAULT_MODES)).split(",") if m.strip()]
    )
    bad = [m for m in modes if m not in MODES]
    if bad or not (modes or args.graph_only):
        ap.error(f"--modes: {bad or modes} not in {MODES}")
    if shape.steps < 1 or shape.warmup < 0:
        ap.error(f"--steps {shape.steps} (>= 1) and --warmup {shape.warmup} (>= 0): measured and warm-up steps")
    if args.mode_budget_s is not None and not args.mode_budget_s > 0:
        ap.error(f"--mode-budget-s {args.mode_budget_s}: a positive number of seconds")
    args.graph_contexts = graph_contexts(ap, args, shape)
    args.graph_loop_costs = graph_loop_batches(ap, args, shape)
    if args.drain_race != "free" and "drain" not in modes:
        ap.error(f"--drain-race {args.drain_race} forces drain's handoffs, and --modes {','.join(modes)} has no drain")
    if args.out is None:
        name = "graph_decode" if args.graph_only else "inflight_handoff"  # never a handoff run's file
        if reasoning:
            name += f"_reasoning_{model_name}_cut{shape.max_tokens}"
            name += "" if args.graph_only else f"_age{shape.max_trajectory_age_steps}"
            name += "_smoke" if args.smoke else ""
        args.out = str(RESULTS.with_name(name + ".json"))
    return args, model_name, shape, modes


__all__ = ["DEFAULT_MODES", "MODES", "RESULTS", "parse_args"]
