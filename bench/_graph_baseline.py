"""The pure graph-decode baseline of ``bench/inflight_handoff.py``: megatron-core's dynamic engine alone, with CUDA
graphs, on a fresh model of the run's shape, so a mode's engine decode can be set beside what the engine gives
without colo-fsm's loop; and the context a decode step of the workload attends over, which the handoff model
reads too (not a benchmark itself: ``run_all`` skips files starting with ``_``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench._gpu import PREFILL_TOKENS_PER_STEP, decode_window_tokens, request_budget
from bench._workload import Shape


def decode_weighted_context(prompt_len: int, lengths: list[int]) -> int:
    """The context a decode step attends over, averaged over every token the workload decodes: a request of output
    length ``L`` decodes from contexts ``prompt_len + 0 .. prompt_len + L - 1``, so long requests weigh by ``L``."""
    tokens = sum(lengths)
    return prompt_len + round(sum(n * (n - 1) / 2 for n in lengths) / tokens) if tokens else prompt_len


KV_FILL = 0.9  # the share of the KV buffer a graph-decode row at a long context may fill (the rest: block rounding)


def baseline_batches(shape: Shape) -> list[int]:
    """The batch sizes the baseline runs: powers of two from 16 below the run's concurrency, and the concurrency."""
    cap = shape.max_active_requests
    return sorted({b for b in (16, 32, 64, 128, 256, 512) if b < cap} | {cap})


def baseline_runs(args: Any) -> bool:
    """Whether the handoff bench runs the graph-decode baseline: on a GPU, with CUDA graphs, unless
    ``--no-graph-baseline``."""
    return args.device == "cuda" and args.cuda_graphs is not None and not args.no_graph_baseline


def batches_that_fit(batches: list[int], context: int, shape: Shape, buffer_gb: float) -> list[int]:
    """The ``batches`` a row from ``context`` tokens can time full: each request's context plus what
    :meth:`~bench._gpu.BenchEngine.decode_rate` asks it for (:func:`~bench._gpu.decode_window_tokens`) within the
    sequence length, every prompt prefilled (:func:`~bench._gpu.prefill_steps`: from 16,384 tokens only one), and
    the batch's keys and values together (bf16, every layer) within ``KV_FILL`` of ``buffer_gb``: at a long context
    a full batch of 256 does not fit."""
    per_token = 2 * shape.num_layers * shape.hidden_size * 2
    room = KV_FILL * buffer_gb * 2**30 // per_token
    fit = []
    for b in batches:
        window = decode_window_tokens(b, context)
        if window is not None and context + window <= shape.sequence_length and b * (context + window) <= room:
            fit.append(b)
    return fit


def rows_by_context(
    eng: Any, contexts: list[int], batches: list[int], shape: Shape, buffer_gb: float
) -> list[dict[str, Any]]:
    """``eng.decode_rate`` from each of ``contexts``, at the batches that fit there (:func:`batches_that_fit`), as
    ``{"context_tokens", "rows"}`` entries. A row whose window did not hold its whole batch (megatron fails a prompt
    it cannot prefill and steps on without it) is an error, not a figure. The first error ends the measuring (the
    engine may still hold that context's requests): its entry records it, and every context after it is recorded as
    not run. :func:`graph_context_errors` reads both."""
    out: list[dict[str, Any]] = []
    failed = None
    for c in contexts:
        entry: dict[str, Any] = {"context_tokens": c, "rows": []}
        out.append(entry)
        if failed is not None:
            entry["error"] = f"not run: the context {failed:,} failed before it"
            continue
        fit = batches_that_fit(batches, c, shape, buffer_gb)
        try:
            for b in fit:
                row = eng.decode_rate(b, prompt_len=c)
                held = (
                    (row.get("window_start") or {}).get("decode_requests"),
                    row.get("decode_requests_at_window_end"),
                )
                if held != (b, b):
                    raise RuntimeError(
                        f"batch {b}: {held[0]} requests decoding at the window's start, {held[1]} at its end"
                    )
                entry["rows"].append(row)
        except Exception as exc:  # recorded and said; the bench's exit status says so (graph_context_errors)
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
            failed = c
        print(f"  graph decode from {c:,} tokens: {entry.get('error') or f'batches {fit}'}", flush=True)
    return out


LOOP_BATCHES = (25, 40, 65, 120)
"""The batches a stage's loop-cost rows time between the captured graphs' sizes (``--graph-loop-costs``): the
requests a decode step held in the runs (sync 25 at 32,768 and 40 at 8,192, park 65 and 113-120). A step runs the
smallest captured graph that holds it; with megatron-core 0.19.2's default sizing, 16 graphs at 256 requests are
the powers of two."""
LOOP_VARIANTS = ("between graphs", "log-probs", "sampled", "mixed contexts", "as the loop", "linear graphs")
"""How the loop-cost rows make the graph alone like a loop's decode steps, one way at a time, then all at once:
batches between the graphs' sizes (``--graph-loop-costs``, :data:`LOOP_BATCHES` in the stage); every step
returning its tokens' log-probs; each token drawn from the whole distribution at temperature 1.0, not greedily, as
the rollouts' are (the baseline's own batches up to 128, for these two); each request at its own context, drawn as
the workload's decoded tokens are (:func:`token_weighted_contexts`; those batches again); the four together at
the batches between graphs; and, on a second engine whose decode graphs megatron sizes linearly (every 16
requests), the batches between graphs with 64 and 128 (:func:`linear_graph_rows`). Each beside the uniform rows
from its contexts' mean tells what that difference costs; the last tells what a graph near a batch's size saves."""


def token_weighted_contexts(prompt_len: int, lengths: list[int], n: int, seed: int) -> list[int]:
    """``n`` contexts as a decode step of the workload meets them: a request of output length ``L`` (one of
    ``lengths``) holds one of its ``L`` decoded tokens' contexts, ``prompt_len`` to ``prompt_len + L - 1``, so a
    long request is met ``L`` times as often as a one-token one (their mean tends to :func:`decode_weighted_context`)."""
    import random

    rng = random.Random(seed)
    weights = [max(0, x) for x in lengths]
    if not any(weights):
        return [prompt_len] * n
    return [prompt_len + rng.randrange(x) for x in rng.choices(lengths, weights=weights, k=n)]


def loop_cost_plan(
    shape: Shape, lengths: list[int], context: int, buffer_gb: float, seed: int, between: list[int]
) -> list[dict[str, Any]]:
    """The loop-cost rows to time (:data:`LOOP_VARIANTS`): ``{"variant", "batch", "logprobs", "sampled",
    "contexts"}`` (None: every request from ``context``), and ``"skipped"`` (why) on a row whose batch does not fit
    one prefill step per request, the sequence length or the KV buffer, with the tokens ``decode_rate`` will ask
    each request for (:func:`~bench._gpu.request_budget`). A drawn context too near the sequence's end to decode
    that many tokens is drawn back to where it can (``"clipped"``: how many were)."""
    per_token = 2 * shape.num_layers * shape.hidden_size * 2
    room = KV_FILL * buffer_gb * 2**30 // per_token
    plan: list[dict[str, Any]] = []

    def add(variant: str, batch: int, *, logprobs: bool = False, sampled: bool = False, mixed: bool = False) -> None:
        contexts = token_weighted_contexts(shape.prompt_len, lengths, batch, seed + batch) if mixed else None
        asked = contexts or [context] * batch
        budget = request_budget(asked)  # what decode_rate asks each request for
        clipped = 0
        if contexts is not None and budget is not None:  # a context too near the sequence's end to decode the window
            top = shape.sequence_length - budget  # drawn back to where it can: a few tokens of thousands
            clipped = sum(c > top for c in contexts)
            contexts = asked = [min(c, top) for c in contexts]
        longest = max(asked)
        row = {"variant": variant, "batch": batch, "logprobs": logprobs, "sampled": sampled, "contexts": contexts}
        row.update({"clipped": clipped} if clipped else {})
        if budget is None or longest > PREFILL_TOKENS_PER_STEP:
            row["skipped"] = f"a context of {longest:,} tokens is not prefilled in one step"
        elif longest + budget > shape.sequence_length:
            row["skipped"] = f"a context of {longest:,} tokens and its window pass the sequence length"
        elif sum(asked) + batch * budget > room:
            row["skipped"] = f"the batch's keys and values pass {KV_FILL:.0%} of the KV buffer"
        plan.append(row)

    uniform = [b for b in baseline_batches(shape) if b <= 128]
    for b in between:
        add("between graphs", b)
    for b in uniform:
        add("log-probs", b, logprobs=True)
    for b in uniform:
        add("sampled", b, sampled=True)
    for b in uniform:
        add("mixed contexts", b, mixed=True)
    for b in between:
        add("as the loop", b, logprobs=True, sampled=True, mixed=True)
    return plan


def loop_cost_rows(eng: Any, plan: list[dict[str, Any]], context: int) -> list[dict[str, Any]]:
    """``eng.decode_rate`` for each row of ``plan`` (:func:`loop_cost_plan`), the row's variant with it. A row whose
    window did not hold its whole batch, or that failed, is an error, not a figure; the first ends the measuring
    (the engine may still hold its requests) and every row after it is recorded as not run."""
    out: list[dict[str, Any]] = []
    failed: str | None = None
    for p in plan:
        row: dict[str, Any] = {"variant": p["variant"], "batch": p["batch"]}
        row.update({"clipped": p["clipped"]} if p.get("clipped") else {})
        out.append(row)
        if p.get("skipped"):
            row["skipped"] = p["skipped"]
            continue
        if failed is not None:
            row["error"] = f"not run: {failed} failed before it"
            continue
        try:
            got = eng.decode_rate(
                p["batch"], prompt_len=context, logprobs=p["logprobs"], sampled=p["sampled"], contexts=p["contexts"]
            )
            held = ((got.get("window_start") or {}).get("decode_requests"), got.get("decode_requests_at_window_end"))
            if held != (p["batch"], p["batch"]):
                raise RuntimeError(f"{held[0]} requests decoding at the window's start, {held[1]} at its end")
            row.update(got)
        except Exception as exc:  # recorded and said; the bench's exit status says so (graph_context_errors)
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            failed = f"{p['variant']} at batch {p['batch']}"
        print(f"  graph decode, {p['variant']}, batch {p['batch']}: {row.get('error') or f'{row["step_ms"]:.2f} ms'}")
    return out


def linear_graph_rows(args: Any, shape: Any, context: int, batches: list[int]) -> dict[str, Any]:
    """The loop-cost rows' last variant, ``linear graphs``: a second engine on a fresh model whose decode graphs are
    captured at megatron's linear sizing (16 graphs at 256 requests: every 16 requests, not the powers of two), timed
    at ``batches`` from ``context`` tokens, so a batch between two powers of two is timed on a graph near its size.
    ``{"rows", "linear_decode_graph_requests", "linear_build_s"}``; a row that fails is recorded, and ends the rows;
    an engine that fails to build records every row as failed (the bench then exits 1)."""
    plan = [
        {"variant": "linear graphs", "batch": b, "logprobs": False, "sampled": False, "contexts": None} for b in batches
    ]
    try:
        with baseline_engine(args, shape, graph_sizing="linear") as eng:
            rows = loop_cost_rows(eng, plan, context)
    except Exception as exc:  # the engine did not build or capture: recorded, and what the first engine timed kept
        why = f"the linearly sized engine failed: {type(exc).__name__}: {exc}"[:300]
        return {"rows": [{"variant": p["variant"], "batch": p["batch"], "error": why} for p in plan]}
    return {
        "rows": rows,
        "linear_decode_graph_requests": eng.build.get("decode_graph_requests"),
        "linear_build_s": eng.build["total_s"],
    }


@contextmanager
def baseline_engine(args: Any, shape: Any, *, graph_sizing: str | None = None) -> Iterator[Any]:
    """megatron-core's dynamic engine alone (:class:`~bench._gpu.BenchEngine`) on a fresh model of the run's shape,
    with the run's KV buffer, concurrency and graph count (and megatron's ``graph_sizing``, None: its default);
    shut down on the way out with what megatron holds of the model's CUDA graphs
    (:func:`~bench._handoff.release_model_graphs`). The model itself lives as long as the engine the caller keeps."""
    import torch

    from bench._gpu import BenchEngine, EngineOptions
    from bench._handoff import release_model_graphs
    from bench._workload import alphabet_of, model_config
    from colo_fsm.adapters.megatron.model import build_model
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

    tok = CharTokenizer(alphabet_of(shape))
    model = build_model(model_config(shape, tok.vocab_size, device="cuda", seed=args.seed, cuda_graphs=True))
    opts = EngineOptions(
        buffer_gb=args.buffer_gb,
        max_requests=shape.max_active_requests,
        max_sequence_length=shape.sequence_length,
        num_cuda_graphs=args.cuda_graphs,
        graph_sizing=graph_sizing,
    )
    eng = BenchEngine(model, tok, opts)
    try:
        yield eng
    finally:
        eng.shutdown(graphs=True)
        release_model_graphs(model)
        torch.cuda.empty_cache()


def graph_decode_baseline(args: Any, shape: Any, model_name: str, lengths: list[int] | None = None) -> dict[str, Any]:
    """Decode tokens/s of megatron-core's dynamic engine alone (CUDA graphs, no lifecycle, no bookkeeping of
    colo-fsm) on a fresh model of the same shape, KV buffer and graph count, at batch sizes up to the run's
    concurrency, each request decoding from a context of prompt + median output length (``rows``, the first
    baseline). With the workload's drawn output ``lengths`` the same batches run again from the context a decode
    step of the workload attends over on average (:func:`decode_weighted_context`; ``rows_matched_context``): a
    long rollout's decode reads more KV than a median one's, so that row tells attention cost from loop cost.
    ``graph_decode_tokens_per_s`` is the rate at ``max_active_requests``; the ratios against park use the batch
    nearest park's mean running requests (``bench._handoff.add_ratios``). Each of ``args.graph_contexts``
    (``--graph-contexts``) runs the batches that fit there (:func:`rows_by_context`): what a decode step costs as
    its requests' contexts grow, where a long rollout decodes. With ``args.graph_loop_costs`` (``--graph-loop-costs``)
    the graph alone is then made like a loop's decode steps (:data:`LOOP_VARIANTS`) from the workload's mean context
    (``rows_loop_costs``), its batches between graphs those the option names."""
    seq_len = shape.sequence_length
    batches = baseline_batches(shape)
    rows: list[dict[str, Any]] = []
    matched_rows: list[dict[str, Any]] = []
    # contexts about as long as a rollout's midpoint: attention over the context is part of a decode step's cost
    context = min(seq_len - 80, shape.prompt_len + int(shape.median_tokens))
    matched = min(seq_len - 80, decode_weighted_context(shape.prompt_len, lengths)) if lengths else None
    by_context: list[dict[str, Any]] = []
    loop_costs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    sizing = getattr(args, "graph_sizing", None)  # the run's own graphs: the baseline times what the run ran on
    with baseline_engine(args, shape, graph_sizing=sizing) as eng:
        for b in batches:
            rows.append(eng.decode_rate(b, prompt_len=context))
        if matched is not None and matched != context:
            for b in batches:
                matched_rows.append(eng.decode_rate(b, prompt_len=matched))
        by_context = rows_by_context(eng, getattr(args, "graph_contexts", None) or [], batches, shape, args.buffer_gb)
        if getattr(args, "graph_loop_costs", None) and lengths and matched is not None:
            plan = loop_cost_plan(shape, lengths, matched, args.buffer_gb, args.seed, args.graph_loop_costs)
            if graph_context_errors({"graph_decode": {"rows_by_context": by_context}}):  # the engine may hold requests
                loop_costs = [{"variant": p["variant"], "batch": p["batch"], "error": "not run: a --graph-contexts row "
                               "failed before it"} for p in plan]  # fmt: skip
            else:
                loop_costs = loop_cost_rows(eng, plan, matched)
    run_s = time.perf_counter() - t0  # the first engine's build and rows (the linear graphs' are their own)
    linear: dict[str, Any] = {}
    if loop_costs and not graph_context_errors({"graph_decode": {"rows_loop_costs": loop_costs}}):
        assert matched is not None  # loop costs run only from the workload's mean context
        linear = linear_graph_rows(args, shape, matched, sorted({*args.graph_loop_costs, 64, 128}))
        loop_costs += linear.pop("rows")
    top = rows[-1]
    return {
        "graph_decode": {
            "model": model_name,
            "rows": rows,
            "graph_sizing": sizing,  # None: megatron's default (exponential)
            "build_s": eng.build["total_s"],
            "run_s": run_s,
            "context_tokens": context,
            "note": "every request decodes from a context of prompt + median output length, the batch stays full",
            **(
                {
                    "rows_matched_context": matched_rows,
                    "matched_context_tokens": matched,
                    "matched_note": "the same batches from the context a decode step of the workload attends over "
                    "on average (prompt + the token-weighted mean output position)",
                }
                if matched_rows
                else {}
            ),
            **({"rows_by_context": by_context} if by_context else {}),
            **({"rows_loop_costs": loop_costs, "loop_costs_context_tokens": matched} if loop_costs else {}),
            "decode_graph_requests": eng.build.get("decode_graph_requests"),
            **linear,
        },
        "graph_decode_tokens_per_s": top["decode_tokens_per_s"],
        "graph_decode_batch": top["batch"],
    }


def graph_context_errors(report: dict[str, Any]) -> list[str]:
    """Each ``--graph-contexts`` and ``--graph-loop-costs`` row of a bench JSON that failed (``context: error``,
    ``variant, batch: error``; a row skipped for want of room is not one): the bench exits 1 when any did, after
    writing what it measured, so a stage that lost a row fails loudly."""
    g = report.get("graph_decode") or {}
    rows = g.get("rows_by_context") or []
    loop = g.get("rows_loop_costs") or []
    return [f"{r['context_tokens']}: {r['error']}" for r in rows if r.get("error")] + [
        f"{r['variant']}, batch {r['batch']}: {r['error']}" for r in loop if r.get("error")
    ]


MODE_ONLY_FLAGS: dict[str, Callable[[Any], bool]] = {
    "--modes": lambda a: a.modes is not None,
    "--steps": lambda a: a.steps is not None,
    "--warmup": lambda a: a.warmup is not None,
    "--quick": lambda a: a.quick,  # fewer steps and warm-up steps, nothing else
    "--rounds": lambda a: a.rounds is not None,
    "--mode-budget-s": lambda a: a.mode_budget_s is not None,
    "--engine": lambda a: a.engine is not None,  # even "direct", the default, when given
    "--drain-race": lambda a: a.drain_race is not None,
    "--buffer-order": lambda a: a.buffer_order is not None,
    "--max-age": lambda a: a.max_age is not None,  # the buffer's and the collector's
    "--num-prompts-per-step": lambda a: a.num_prompts_per_step is not None,  # a training step's prompts
    "--temperature": lambda a: a.temperature is not None,  # the modes' requests (the baseline samples at 1.0)
    "--micro-batch-tokens": lambda a: a.micro_batch_tokens is not None,  # the trainer's
    "--sample-timeout": lambda a: a.sample_timeout is not None,  # the trainer's wait on the buffer
    "--verbose": lambda a: a.verbose,  # a line per training step
}
"""The options of ``bench/inflight_handoff.py`` only the modes read, each with whether it was given: ``--graph-only``
refuses them, never ignores.
The graph-decode baseline reads the model, ``--max-len``, ``--median-tokens``, ``--sigma``, ``--samples-per-group``
and ``--seed`` (the contexts), ``--max-active`` (the batches), ``--buffer-gb`` and ``--cuda-graphs``."""


def graph_only_refusal(args: Any) -> str | None:
    """Why ``--graph-only`` refuses the handoff bench's ``args``: an option only the modes read
    (:data:`MODE_ONLY_FLAGS`), or ``--no-graph-baseline``, named; None where nothing stands in its way."""
    for flag, given in MODE_ONLY_FLAGS.items():
        if given(args):
            return f"--graph-only runs no mode, and {flag} only shapes the modes"
    if args.no_graph_baseline:
        return "--graph-only runs the graph-decode baseline alone, and --no-graph-baseline skips it"
    return None


def _baseline_numbers(
    ap: argparse.ArgumentParser, args: argparse.Namespace, flag: str, top: int, what: str
) -> list[int]:
    """A comma-separated option of the graph-decode baseline read (``flag``, its value on ``args``): whole numbers
    from 1 to ``top`` (``what`` says of what, and why that top), only where the baseline runs
    (:func:`baseline_runs`), never ignored; an empty value asks for none (a GPU stage's CPU twin says so)."""
    value = getattr(args, flag[2:].replace("-", "_"))
    if value is None or not value.strip():
        return []
    if not baseline_runs(args):
        ap.error(
            f"{flag} {value!r} runs with the graph-decode baseline, which runs on a GPU with CUDA graphs and without "
            "--no-graph-baseline"
        )
    try:
        numbers = [int(c) for c in value.split(",") if c.strip()]
    except ValueError:
        numbers = []
    if not numbers or any(not 0 < c <= top for c in numbers):
        ap.error(f"{flag} {value!r}: comma-separated whole numbers of {what}")
    return numbers


def graph_contexts(ap: argparse.ArgumentParser, args: argparse.Namespace, shape: Shape) -> list[int]:
    """``--graph-contexts`` read (:func:`_baseline_numbers`): each a context in tokens from 1 to what megatron
    prefills in one step (:data:`~bench._gpu.PREFILL_TOKENS_PER_STEP`) from which some baseline batch fits
    (:func:`batches_that_fit`)."""
    top = PREFILL_TOKENS_PER_STEP
    contexts = _baseline_numbers(
        ap, args, "--graph-contexts", top, f"tokens, 1 to {top:,} (megatron prefills a prompt in one step of at most "
        "that many tokens)"
    )  # fmt: skip
    batches = baseline_batches(shape)
    if none := [c for c in contexts if not batches_that_fit(batches, c, shape, args.buffer_gb)]:
        ap.error(
            f"--graph-contexts {args.graph_contexts!r}: no batch of {batches} fits from {none[0]:,} tokens "
            f"({args.buffer_gb:g} GiB of KV buffer, sequences of {shape.sequence_length:,} tokens)"
        )
    return contexts


def graph_loop_batches(ap: argparse.ArgumentParser, args: argparse.Namespace, shape: Shape) -> list[int]:
    """``--graph-loop-costs`` read (:func:`_baseline_numbers`): whole batches from 1 to the run's concurrency."""
    top = shape.max_active_requests
    return _baseline_numbers(ap, args, "--graph-loop-costs", top, f"requests, 1 to {top} (--max-active)")


__all__ = [
    "KV_FILL",
    "MODE_ONLY_FLAGS",
    "baseline_batches",
    "baseline_engine",
    "baseline_runs",
    "batches_that_fit",
    "decode_weighted_context",
    "graph_context_errors",
    "graph_contexts",
    "graph_decode_baseline",
    "graph_loop_batches",
    "graph_only_refusal",
    "linear_graph_rows",
    "loop_cost_plan",
    "loop_cost_rows",
    "rows_by_context",
    "token_weighted_contexts",
]
