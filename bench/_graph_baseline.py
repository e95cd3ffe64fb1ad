"""The pure graph-decode baseline of ``bench/inflight_handoff.py``: megatron-core's dynamic engine alone, with CUDA
graphs, on a fresh model of the run's shape, so a mode's engine decode can be set beside what the engine gives
without colo-fsm's loop; and the context a decode step of the workload attends over, which the handoff model
reads too (not a benchmark itself: ``run_all`` skips files starting with ``_``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from bench._gpu import PREFILL_TOKENS_PER_STEP, decode_window_tokens
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
    its requests' contexts grow, where a long rollout decodes."""
    import torch
    from megatron.core.transformer.cuda_graphs import delete_cuda_graphs

    from bench._gpu import BenchEngine, EngineOptions
    from bench._workload import alphabet_of, model_config
    from colo_fsm.adapters.megatron.model import build_model
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

    tok = CharTokenizer(alphabet_of(shape))
    seq_len = shape.sequence_length
    model = build_model(model_config(shape, tok.vocab_size, device="cuda", seed=args.seed, cuda_graphs=True))
    batches = baseline_batches(shape)
    t0 = time.perf_counter()
    eng = BenchEngine(
        model,
        tok,
        EngineOptions(
            buffer_gb=args.buffer_gb,
            max_requests=shape.max_active_requests,
            max_sequence_length=seq_len,
            num_cuda_graphs=args.cuda_graphs,
        ),
    )
    rows: list[dict[str, Any]] = []
    matched_rows: list[dict[str, Any]] = []
    # contexts about as long as a rollout's midpoint: attention over the context is part of a decode step's cost
    context = min(seq_len - 80, shape.prompt_len + int(shape.median_tokens))
    matched = min(seq_len - 80, decode_weighted_context(shape.prompt_len, lengths)) if lengths else None
    by_context: list[dict[str, Any]] = []
    try:
        for b in batches:
            rows.append(eng.decode_rate(b, prompt_len=context))
        if matched is not None and matched != context:
            for b in batches:
                matched_rows.append(eng.decode_rate(b, prompt_len=matched))
        by_context = rows_by_context(eng, getattr(args, "graph_contexts", None) or [], batches, shape, args.buffer_gb)
    finally:
        eng.shutdown(graphs=True)
        delete_cuda_graphs()
        del model
        torch.cuda.empty_cache()
    top = rows[-1]
    return {
        "graph_decode": {
            "model": model_name,
            "rows": rows,
            "build_s": eng.build["total_s"],
            "run_s": time.perf_counter() - t0,
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
        },
        "graph_decode_tokens_per_s": top["decode_tokens_per_s"],
        "graph_decode_batch": top["batch"],
    }


def graph_context_errors(report: dict[str, Any]) -> list[str]:
    """Each ``--graph-contexts`` row of a bench JSON that failed (``context: error``): the bench exits 1 when any
    did, after writing what it measured, so a stage that lost a row fails loudly."""
    rows = (report.get("graph_decode") or {}).get("rows_by_context") or []
    return [f"{r['context_tokens']}: {r['error']}" for r in rows if r.get("error")]


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


def graph_contexts(ap: argparse.ArgumentParser, args: argparse.Namespace, shape: Shape) -> list[int]:
    """``--graph-contexts`` read: each a whole number of tokens from 1 to what megatron prefills in one step
    (:data:`~bench._gpu.PREFILL_TOKENS_PER_STEP`) from which some baseline batch fits (:func:`batches_that_fit`),
    and only where the graph-decode baseline runs (:func:`baseline_runs`), never ignored; an empty value asks for
    none (a GPU stage's CPU twin says so)."""
    if args.graph_contexts is None or not args.graph_contexts.strip():
        return []
    if not baseline_runs(args):
        ap.error(
            f"--graph-contexts {args.graph_contexts!r} runs with the graph-decode baseline, which runs on a GPU with "
            "CUDA graphs and without --no-graph-baseline"
        )
    top = PREFILL_TOKENS_PER_STEP
    try:
        contexts = [int(c) for c in args.graph_contexts.split(",") if c.strip()]
    except ValueError:
        contexts = []
    if not contexts or any(not 0 < c <= top for c in contexts):
        ap.error(
            f"--graph-contexts {args.graph_contexts!r}: comma-separated whole numbers of tokens, 1 to {top:,} "
            "(megatron prefills a prompt in one step of at most that many tokens)"
        )
    batches = baseline_batches(shape)
    if none := [c for c in contexts if not batches_that_fit(batches, c, shape, args.buffer_gb)]:
        ap.error(
            f"--graph-contexts {args.graph_contexts!r}: no batch of {batches} fits from {none[0]:,} tokens "
            f"({args.buffer_gb:g} GiB of KV buffer, sequences of {shape.sequence_length:,} tokens)"
        )
    return contexts


__all__ = [
    "KV_FILL",
    "MODE_ONLY_FLAGS",
    "baseline_batches",
    "baseline_runs",
    "batches_that_fit",
    "decode_weighted_context",
    "graph_context_errors",
    "graph_contexts",
    "graph_decode_baseline",
    "graph_only_refusal",
    "rows_by_context",
]
