"""Colocated decode (the model that trains) against a dedicated inference-only instance of the same weights.

Two fresh processes, one after the other, so neither sees the other's CUDA graphs or allocator state:

* ``colocated``: the GPT with ``MegatronTrainer``; two train steps (optimizer state on the GPU, gradients
  freed at the handoff), then the weights saved and the dynamic engine decodes on the same model object. Also
  records the memory of this run (phase snapshots and the peak) with its configuration and colo-fsm's memory
  budget for it.
* ``dedicated``: the same architecture built for inference only (eval, ``requires_grad=False``, no optimizer,
  no gradients) loading those weights; same engine settings, same batches and lengths.

Decode tokens/s at each batch size (requests prefilled, a window of pure decode steps timed), and greedy
tokens of both (same weights: they should agree).

    python bench/colocated_vs_dedicated.py --out bench/results/colocated_vs_dedicated.json   # GPU, ~1 min
    python bench/colocated_vs_dedicated.py --role colocated --graphs off --out x.json     # one role only

One process on block scope (``--role inprocess --scope block``) gives 0.91-1.06x. In two processes on per-layer
graphs colocated decode ran 0.57-0.68x dedicated (an H200 and an H100) while the colocated role wrote its weights at
its end, and 0.87-0.98x at 73940c4, which writes them before its decode: the 64-step windows are short (the
host's pace) and a whole process can run slow (windows 1.45-1.75x as long), as 3 of 4 colocated processes did
again with ``--save-weights at-end`` on one H200 (not the fifth, on an H100 at 2b672ff). Each of
``--dedicated-first`` (order), ``--train-steps 0`` (no training; the trainer built), ``--freeze`` (no parameter
requires grad while the colocated model decodes) and ``--save-weights at-end`` (which also has the dedicated role
load weights two train steps later) changes one setting of the two-process run (stages
``colocated-vs-dedicated-two-processes-*``; docs/gpu-runs/README.md has the runs). A role that fails, or a failed
section, makes it exit 1.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository, for bench.* and colo_fsm
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _gpu as g  # noqa: E402
from bench._provenance import provenance  # noqa: E402

TRAIN_BATCH = 8
TRAIN_COMPLETION = 480  # + 32 prompt tokens = 512 per sequence


def memory_config(model: Any, opts: g.EngineOptions, shape: g.GPTShape, trainer: Any | None) -> dict[str, Any]:
    """What a memory estimate needs: parameter count and dtypes, optimizer, KV buffer, train batch shape."""
    p = next(model.parameters())
    opt_state_bytes = 0
    main_param_bytes = 0
    if trainer is not None:
        from colo_fsm.adapters.megatron.train_backend import torch_optimizers

        for opt in torch_optimizers(trainer.optimizer):
            for st in opt.state.values():
                for v in st.values():
                    if hasattr(v, "is_cuda") and v.is_cuda:
                        opt_state_bytes += v.numel() * v.element_size()
            if trainer.backend == "megatron":  # fp32 main copies of bf16 parameters
                main_param_bytes += sum(q.numel() * q.element_size() for grp in opt.param_groups for q in grp["params"])
    return {
        "params": g.n_params(model),
        "param_dtype": str(p.dtype),
        "param_bytes": sum(x.numel() * x.element_size() for x in model.parameters()),
        "optimizer": None if trainer is None else f"{type(trainer.optimizer).__name__} ({trainer.backend} backend)",
        "optimizer_state_bytes_on_gpu": opt_state_bytes,
        "optimizer_main_param_bytes": main_param_bytes,
        "kv_buffer_gib": opts.buffer_gb,
        "kv_block_size_tokens": opts.block_size_tokens,
        "max_requests": opts.max_requests,
        "max_sequence_length": opts.max_sequence_length,
        "num_cuda_graphs": opts.num_cuda_graphs,
        "train_batch": TRAIN_BATCH,
        "train_seq_len": 32 + TRAIN_COMPLETION,
        "layers": shape.layers,
        "hidden": shape.hidden,
        "heads": shape.heads,
        "ffn_hidden": 4 * shape.hidden,
        "vocab": shape.vocab,
        "activation_recompute": False,
        "tensor_model_parallel_size": 1,
    }


def budget_estimate(model: Any, trainer: Any, opts: g.EngineOptions, capacity_gib: float) -> dict[str, float]:
    """colo-fsm's memory budget for this run (``colo_fsm.guards.memory``, the model's footprint as the megatron
    adapter reads it, the train batch this bench runs, the persist KV buffer), in GiB, and its total without the
    margin: what the measured peak should come close to."""
    from colo_fsm.adapters.megatron.memory import training_shape
    from colo_fsm.guards.memory import MemoryBudget, estimate

    budget = MemoryBudget(
        micro_batch_size=TRAIN_BATCH, sequence_length=32 + TRAIN_COMPLETION, optimizer_shards=trainer.optimizer_shards
    )
    est = estimate(
        training_shape(model), budget, buffer_size_gb=opts.buffer_gb, kv_cache_mode="persist", capacity_gib=capacity_gib
    )
    return {**est.breakdown(), "without_margin_gib": est.total_gib - est.margin_gib}


def _threads() -> int | None:
    """The process's OS threads (``/proc/self/status``), or None where that is not there."""
    try:
        status = Path("/proc/self/status").read_text(encoding="utf-8")
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), None)


def _usage() -> tuple[float, float, int, int, int] | None:
    """This process's user and system CPU seconds, voluntary and involuntary context switches and minor page
    faults so far (``getrusage``), or None where the platform has none (never zeros a reader could take as counts)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux
        return None
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return (ru.ru_utime, ru.ru_stime, ru.ru_nvcsw, ru.ru_nivcsw, ru.ru_minflt)


def host_pace[T](fn: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """``fn()`` and what the host did while it ran, for a window as long at batch 1 as at 64 (the host's pace) that
    is slow in one process and not another. Wall seconds and the process's user and system CPU seconds: CPU over
    wall above 1 means other threads worked meanwhile; about 1 is a busy thread, which a thread waiting on the GPU
    also is (CUDA spins while it waits by default); below 1 means a thread was taken off a core or blocked in a
    system call. Voluntary and involuntary context switches tell blocking from contention; minor page faults, the
    OS threads before and after, the garbage collector's collections per generation and the CPUs the process may
    run on complete it. Where the platform has no ``getrusage``, the CPU and the counts are None."""
    gc_before, threads_before, usage_before = [s["collections"] for s in gc.get_stats()], _threads(), _usage()
    start = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - start
    usage_after = _usage()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pace: dict[str, Any] = {
        "wall_s": wall,
        "cpu_s": None,
        "user_s": None,
        "system_s": None,
        "cpu_over_wall": None,
        "context_switches": None,
        "minor_page_faults": None,
        "threads": [threads_before, _threads()],
        "gc_collections": [s["collections"] - c for s, c in zip(gc.get_stats(), gc_before, strict=True)],
        "cpus_allowed": len(affinity) if affinity is not None else None,
    }
    if usage_before is not None and usage_after is not None:
        user, system, voluntary, involuntary, faults = (a - b for a, b in zip(usage_after, usage_before, strict=True))
        pace.update(
            cpu_s=user + system,
            user_s=user,
            system_s=system,
            cpu_over_wall=(user + system) / wall if wall > 0 else None,
            context_switches={"voluntary": voluntary, "involuntary": involuntary},
            minor_page_faults=faults,
        )
    return out, pace


def graph_pool_bytes() -> tuple[int, int]:
    """(reserved, allocated) bytes in the CUDA-graph memory pool (0, 0 when none)."""
    try:
        from megatron.core.inference.engines.dynamic_engine import _cuda_graph_mempool_bytes

        return _cuda_graph_mempool_bytes()
    except Exception:
        return (0, 0)


def run_role(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    g.quiet_logs()
    shape = g.GPTShape()
    g.setup("cuda")
    torch.cuda.reset_peak_memory_stats()
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    tok = CharTokenizer()
    graphs = args.graphs == "on"
    opts = g.EngineOptions(
        buffer_gb=args.buffer_gb,
        max_requests=args.max_requests,
        max_sequence_length=shape.seq,
        num_cuda_graphs=args.num_cuda_graphs if graphs else None,
    )
    out: dict[str, Any] = {"role": args.role, "graphs": graphs, "machine": g.machine_info("cuda")}
    res = g.Results(args.out, **out)
    mem = []
    model = g.build_gpt(shape, "cuda", graphs=graphs, scope=args.scope)
    mem.append(g.mem_snapshot("model built"))
    trainer = None
    if args.role == "colocated":
        trainer = MegatronTrainer(model, TrainerConfig(lr=1e-4))
        trainer.mode.to_training()  # a graphs model is built in decode mode; train in training mode, as the loop does
        batch = g.rollouts(TRAIN_BATCH, [TRAIN_COMPLETION])
        with res.section("train_before_engine") as sec:
            times = []
            for _ in range(args.train_steps):
                _, dt = g.timed(lambda: trainer.train_step(batch))
                times.append(dt)
            trainer.offload_buffers()  # gradients freed at the handoff; the optimizer state stays on the GPU
            sec["step_s"] = times
            mem.append(g.mem_snapshot(f"after {args.train_steps} train steps, grads freed"))
        if args.weights and args.save_weights == "before-decode":  # the weights the dedicated role loads
            torch.save(model.state_dict(), args.weights)
        if args.freeze:  # the trained model's parameters stop requiring grad while it decodes (back on after)
            model.requires_grad_(False)
    else:
        if args.weights and Path(args.weights).exists():
            sd = torch.load(args.weights, map_location="cuda")
            missing, unexpected = model.load_state_dict(sd, strict=False)
            res.put("load_state_dict", {"missing": list(missing), "unexpected": list(unexpected)})
        else:  # run first (--dedicated-first): the model's own initial weights, the colocated role's before training
            res.put("load_state_dict", "none: the seed's initial weights")
        model.requires_grad_(False)
        model.eval()
    eng = None
    with res.section("engine") as sec:
        eng = g.BenchEngine(model, tok, opts)
        sec["build"] = eng.build
        sec["graph_pool_bytes"] = graph_pool_bytes()
        mem.append(g.mem_snapshot("engine up"))
    if eng is not None:
        with res.section("decode") as sec:
            eq_prompts = g.prompts(16, 32, seed=7)
            sec["greedy"] = eng.generate(eq_prompts, 64)
            paced = [host_pace(functools.partial(eng.decode_rate, b, steps=args.steps)) for b in args.batch_list]
            sec["decode"] = [rate for rate, _ in paced]
            sec["host"] = [pace for _, pace in paced]  # around each decode_rate call: a slow pace's clues
            mem.append(g.mem_snapshot("after decode"))
    if args.role == "colocated" and trainer is not None:
        if args.freeze:  # a decode-only comparison: the train steps after it belong to the memory run
            model.requires_grad_(True)
            res.put("train_after_engine", {"skipped": "--freeze"})
        else:
            with res.section("train_after_engine") as sec:
                if eng is not None:
                    eng.suspend()
                trainer.restore_buffers()
                times = []
                for _ in range(2):
                    _, dt = g.timed(lambda: trainer.train_step(batch))
                    times.append(dt)
                mem.append(g.mem_snapshot("after train steps with the engine suspended (peak of the run)"))
                trainer.offload_buffers()
                if eng is not None:
                    eng.resume()
                    eng.generate(g.prompts(4, 16), 8)
                sec["step_s"] = times
        with res.section("memory") as sec:
            sec["config"] = memory_config(model, opts, shape, trainer)
            sec["graph_pool_bytes_end"] = graph_pool_bytes()
            sec["phases"] = mem
            sec["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            sec["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            free, total = torch.cuda.mem_get_info()
            sec["device_used_gib_end"] = (total - free) / 2**30
            sec["estimate"] = budget_estimate(model, trainer, opts, total / 2**30)
            sec["estimate_over_peak"] = sec["estimate"]["without_margin_gib"] / sec["peak_allocated_gib"]
            sec["note"] = (
                "peak_* from torch.cuda.max_memory_*(); device_used from mem_get_info (includes the CUDA "
                "context, NCCL and cuBLAS workspaces, which the caching allocator does not count)"
            )
        if args.weights and args.save_weights == "at-end":  # the order of the runs before 73940c4
            torch.save(model.state_dict(), args.weights)
    res.put("memory_phases", mem)
    return res.data


def run_inprocess(args: argparse.Namespace) -> dict[str, Any]:
    """Both instances in one process, measured in alternating rounds (the decode step is CPU-bound, so
    machine noise between two processes is larger than the effect); a train step on the colocated model
    between rounds. Use ``inference_cuda_graph_scope="block"`` here: with per-layer graphs, megatron-core
    feeds a layer's graph from the previous layer's output buffer found in a process-wide record, which two
    graph models in one process would share."""
    import statistics

    g.quiet_logs()
    shape = g.GPTShape()
    g.setup("cuda")
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    tok = CharTokenizer()
    graphs = args.graphs == "on"
    opts = g.EngineOptions(
        buffer_gb=args.buffer_gb,
        max_requests=args.max_requests,
        max_sequence_length=shape.seq,
        num_cuda_graphs=args.num_cuda_graphs if graphs else None,
    )
    res = g.Results(
        args.out,
        bench="colocated_vs_dedicated",
        role="inprocess",
        scope=args.scope,
        graphs=graphs,
        command=" ".join(["python", "bench/colocated_vs_dedicated.py", "--role", "inprocess", "--scope", args.scope]),
        machine=g.machine_info("cuda"),
    )
    colo = g.build_gpt(shape, "cuda", graphs=graphs, scope=args.scope)
    trainer = MegatronTrainer(colo, TrainerConfig(lr=1e-5))
    trainer.mode.to_training()  # a graphs model is built in decode mode; train in training mode, as the loop does
    batch = g.rollouts(TRAIN_BATCH, [TRAIN_COMPLETION])
    for _ in range(2):
        trainer.train_step(batch)
    trainer.offload_buffers()
    ded = g.build_gpt(shape, "cuda", graphs=graphs, scope=args.scope, reset_rng=False)
    missing, unexpected = ded.load_state_dict(colo.state_dict(), strict=False)
    ded.requires_grad_(False)
    ded.eval()
    res.put("load_state_dict", {"missing": list(missing), "unexpected": list(unexpected)})
    engines = {}
    with res.section("engines") as sec:
        for name, m in (("colocated", colo), ("dedicated", ded)):
            engines[name] = g.BenchEngine(m, tok, opts)
            engines[name].suspend()
            sec[name] = engines[name].build
    with res.section("greedy") as sec:
        eq_prompts = g.prompts(16, 32, seed=7)
        outs = {}
        for name, e in engines.items():
            e.resume()
            outs[name] = [t for t, _ in e.generate(eq_prompts, 64)]
            e.suspend()
        sec["identical"] = outs["colocated"] == outs["dedicated"]
    rounds: dict[str, dict[int, list[float]]] = {n: {b: [] for b in args.batch_list} for n in engines}
    with res.section("rounds") as sec:
        log = []
        for r in range(args.rounds):
            order = ["colocated", "dedicated"] if r % 2 == 0 else ["dedicated", "colocated"]
            for name in order:
                e = engines[name]
                e.resume()
                for b in args.batch_list:
                    d = e.decode_rate(b, steps=args.steps)
                    rounds[name][b].append(d["decode_tokens_per_s"])
                    log.append({"round": r, "instance": name, **d})
                e.suspend()
            trainer.restore_buffers()
            trainer.train_step(batch)  # the colocated model trains between rounds, as in the loop
            trainer.offload_buffers()
        sec["log"] = log
    med = {n: {b: statistics.median(v) for b, v in per.items() if v} for n, per in rounds.items()}
    ratios = {
        b: med["colocated"][b] / med["dedicated"][b]
        for b in args.batch_list
        if med["colocated"].get(b) and med["dedicated"].get(b)
    }
    res.put("median_tokens_per_s", med)
    res.put("ratios", ratios)
    res.data["ratios"] = ratios
    res.data["greedy_identical_before_training_between_rounds"] = (
        res.data["sections"].get("greedy", {}).get("identical")
    )
    res.flush()
    rows = [
        {
            "batch": b,
            "colocated tok/s": med["colocated"].get(b),
            "dedicated tok/s": med["dedicated"].get(b),
            "ratio": ratios.get(b),
        }
        for b in args.batch_list
    ]
    print(g.table(rows, ["batch", "colocated tok/s", "dedicated tok/s", "ratio"]))
    print("greedy identical:", res.data["greedy_identical_before_training_between_rounds"])
    return res.data


# the roles that read each option that only some roles read: one given for another role is refused, not ignored
ROLE_OPTIONS: dict[str, tuple[str, ...]] = {
    "rounds": ("inprocess",),
    "weights": ("colocated", "dedicated"),
    "timeout": ("both",),
    "train_steps": ("both", "colocated"),
    "freeze": ("both", "colocated"),
    "save_weights": ("both", "colocated"),
    "dedicated_first": ("both",),
}
GRAPH_OPTIONS = ("scope", "num_cuda_graphs")  # read only with --graphs on


def build_parser() -> argparse.ArgumentParser:
    """The command line of the bench and of each role process the two-process run starts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", default="both", choices=("both", "colocated", "dedicated", "inprocess"))
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (--role inprocess)")
    ap.add_argument("--out", default="bench/results/colocated_vs_dedicated.json")
    ap.add_argument("--weights", default=None, help="weights file (written by colocated, read by dedicated)")
    ap.add_argument("--graphs", default="on", choices=("on", "off"))
    ap.add_argument("--scope", default="layer", choices=("layer", "block"), help="inference_cuda_graph_scope")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--num-cuda-graphs", type=int, default=16)
    ap.add_argument("--buffer-gb", type=float, default=4.0)
    ap.add_argument("--max-requests", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per role process")
    ap.add_argument(
        "--train-steps", type=int, default=2, help="train steps before the colocated engine (0: the trainer built only)"
    )
    ap.add_argument(
        "--freeze", action="store_true", help="the colocated model's parameters stop requiring grad while it decodes"
    )
    ap.add_argument(
        "--save-weights",
        default="before-decode",
        choices=("before-decode", "at-end"),
        help="when the colocated role writes the weights the dedicated role loads: after its first train steps, "
        "before it decodes (the decoded weights: greedy compared), or at its end, after two more train steps (the "
        "runs before 73940c4, whose colocated decode ran 0.57-0.68x dedicated)",
    )
    ap.add_argument(
        "--dedicated-first",
        action="store_true",
        help="run the dedicated role first, on the seed's initial weights (the colocated role's with --train-steps 0)",
    )
    return ap


def given_options(ap: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The options (their ``dest``) typed on the command line ``argv``, at their default value or not."""
    bare = copy.deepcopy(ap)
    for action in bare._actions:
        action.default = argparse.SUPPRESS
    return set(vars(bare.parse_args(argv)))


def flag(dest: str, value: object) -> str:
    """An option as typed: ``--train-steps 0``, or ``--freeze`` for a switch."""
    name = "--" + dest.replace("_", "-")
    return name if isinstance(value, bool) else f"{name} {value}"


def parse(argv: list[str] | None) -> argparse.Namespace:
    """``argv`` parsed and checked. A usage error names the option and what was expected: an option its role does
    not read (``ROLE_OPTIONS``) or graph options with ``--graphs off``, given at any value; a count below 1 (0
    train steps is allowed); batches that are not positive integers; weights for the dedicated role that are not
    there; weights written at the end where no dedicated role loads them."""
    ap = build_parser()
    args = ap.parse_args(argv)
    given = given_options(ap, argv)
    for dest, roles in ROLE_OPTIONS.items():
        if dest in given and args.role not in roles:
            ap.error(
                f"{flag(dest, getattr(args, dest))} with --role {args.role}: only --role {' or '.join(roles)} reads it"
            )
    for dest in GRAPH_OPTIONS:
        if dest in given and args.graphs == "off":
            ap.error(f"{flag(dest, getattr(args, dest))} with --graphs off: expected --graphs on (only graphs read it)")
    for dest in ("steps", "rounds", "num_cuda_graphs", "max_requests"):
        if getattr(args, dest) < 1:
            ap.error(f"{flag(dest, getattr(args, dest))}: expected 1 or more")
    if args.train_steps < 0:
        ap.error(f"--train-steps {args.train_steps}: expected 0 or more")
    if args.buffer_gb <= 0:
        ap.error(f"--buffer-gb {args.buffer_gb}: expected a size in GiB above 0")
    try:
        args.batch_list = [int(b) for b in args.batches.split(",")]
    except ValueError:
        args.batch_list = []
    if not args.batch_list or min(args.batch_list) < 1:
        ap.error(f"--batches {args.batches!r}: expected comma-separated batch sizes of 1 or more, e.g. 1,16,64")
    if args.role == "dedicated" and args.weights and not Path(args.weights).is_file():
        ap.error(f"--weights {args.weights}: no such file for the dedicated role to load (leave it out: the seed's)")
    if "save_weights" in given and args.role == "colocated" and not args.weights:
        ap.error(f"--save-weights {args.save_weights} with --role colocated and no --weights: expected a file")
    if args.save_weights == "at-end" and args.dedicated_first:
        ap.error(
            "--save-weights at-end with --dedicated-first: the dedicated role runs first and loads no weights; "
            "expected the dedicated role second"
        )
    return args


def role_argv(args: argparse.Namespace, role: str, out: str, weights: str) -> list[str]:
    """The command line of one role process of the two-process run: the shared settings, the colocated-only options
    for the colocated role alone, and the weights file only where the dedicated role loads it (not run first)."""
    colocated_only = [
        *("--train-steps", str(args.train_steps)),
        *(["--freeze"] if args.freeze else []),
        *([] if args.dedicated_first else ["--save-weights", args.save_weights]),  # no weights file: none written
    ]
    graphs = ["--scope", args.scope, "--num-cuda-graphs", str(args.num_cuda_graphs)] if args.graphs == "on" else []
    return [
        *("--role", role, "--out", out),
        *([] if args.dedicated_first else ["--weights", weights]),
        *("--graphs", args.graphs, *graphs, "--batches", args.batches, "--steps", str(args.steps)),
        *("--buffer-gb", str(args.buffer_gb), "--max-requests", str(args.max_requests)),
        *(colocated_only if role == "colocated" else []),
    ]


def summary_rows(parts: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """The two roles' decode rates side by side per batch, with each window's host CPU over wall where the role
    recorded it (``host_pace``), and colocated over dedicated per batch where both decoded it."""
    by_role: dict[str, dict[int, tuple[dict[str, Any], dict[str, Any]]]] = {}
    for role in ("colocated", "dedicated"):
        sec = parts.get(role, {}).get("sections", {}).get("decode", {})
        rates = sec.get("decode", [])
        hosts = list(sec.get("host") or [])  # runs before host_pace recorded none: no host column, same rates
        hosts += [{}] * (len(rates) - len(hosts))
        by_role[role] = {r["batch"]: (r, h) for r, h in zip(rates, hosts)}
    rows, ratios = [], {}
    for b in sorted(set(by_role["colocated"]) | set(by_role["dedicated"])):
        (c, ch), (d, dh) = (by_role[role].get(b, ({}, {})) for role in ("colocated", "dedicated"))
        rate_c, rate_d = c.get("decode_tokens_per_s"), d.get("decode_tokens_per_s")
        if rate_c and rate_d:
            ratios[b] = rate_c / rate_d
        rows.append(
            {
                **{"batch": b, "colocated tok/s": rate_c, "dedicated tok/s": rate_d, "ratio": ratios.get(b)},
                **{"col cpu/wall": ch.get("cpu_over_wall"), "ded cpu/wall": dh.get("cpu_over_wall")},
            }
        )
    return rows, ratios


def same_weights(args: argparse.Namespace) -> bool:
    """Whether the two roles decoded the same weights (their greedy tokens then should agree): a dedicated role run
    first decodes the seed's initial weights, the colocated role's only when it trains none; weights written at the
    end were trained two more steps after the colocated decode (none with ``--freeze``)."""
    return (not args.dedicated_first or args.train_steps == 0) and (args.save_weights == "before-decode" or args.freeze)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under

    import torch

    if not torch.cuda.is_available():
        print("colocated_vs_dedicated: needs a GPU (megatron-core's dynamic engine); nothing measured here")
        return 0
    if args.role == "inprocess":
        return g.failed_sections(run_inprocess(args))
    if args.role != "both":
        return g.failed_sections(run_role(args))

    out_path = Path(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="colo_ded_"))
    weights = str(tmp / "weights.pt")
    parts: dict[str, Any] = {}
    for role in ("dedicated", "colocated") if args.dedicated_first else ("colocated", "dedicated"):
        part = tmp / f"{role}.json"
        cmd = [sys.executable, __file__, *role_argv(args, role, str(part), weights)]
        rc: int | str
        t = time.perf_counter()
        print(f"=== {role}: {' '.join(cmd)}", flush=True)
        try:
            rc = subprocess.run(cmd, timeout=args.timeout, env=os.environ.copy()).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        parts[role] = json.loads(part.read_text()) if part.exists() else {"missing": True}
        parts[role]["rc"] = rc
        parts[role]["wall_s"] = time.perf_counter() - t
    result: dict[str, Any] = {
        "bench": "colocated_vs_dedicated",
        "provenance": prov,
        "command": " ".join(
            ["python", "bench/colocated_vs_dedicated.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "parts": parts,
    }
    rows, ratios = summary_rows(parts)
    result["ratios"] = ratios
    cg = parts["colocated"].get("sections", {}).get("decode", {}).get("greedy")
    dg = parts["dedicated"].get("sections", {}).get("decode", {}).get("greedy")
    if cg and dg:
        result["greedy_identical"] = [t for t, _ in cg] == [t for t, _ in dg]
        result["greedy_same_weights"] = same_weights(args)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1, default=str))
    print(g.table(rows, ["batch", "colocated tok/s", "dedicated tok/s", "ratio", "col cpu/wall", "ded cpu/wall"]))
    print("greedy identical:", result.get("greedy_identical"))
    mem = parts["colocated"].get("sections", {}).get("memory", {})
    if mem:
        print("memory peak allocated GiB:", round(mem.get("peak_allocated_gib", 0), 2), "config:", mem.get("config"))
    print(f"wrote {out_path}")
    failed = {role: p["rc"] for role, p in parts.items() if p["rc"] != 0}  # a role's failed section exits 1
    if failed:
        print(f"FAILED roles (exit status): {failed}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
