"""Shared pieces of the GPU benchmarks (not a benchmark itself: ``run_all`` skips files starting with ``_``).

The model is megatron-core's ``GPTModel`` built like :func:`colo_fsm.adapters.megatron.model.build_model`
(local layer spec, :class:`SDPAttention` core attention for the training forward), with the CUDA-graph
settings of the ``TransformerConfig`` set here directly: ``cuda_graph_impl="local"`` needs the inference RNG
tracker (``model_parallel_cuda_manual_seed(..., inference_rng_tracker=True)``), else ``GPTModel``
construction fails with "RNG tracker does not support cudagraphs!".

:class:`BenchEngine` builds megatron-core's dynamic inference pipeline (context, inference wrapper,
controller, ``DynamicInferenceEngine``: what ``MegatronLLM(use_coordinator=False)`` builds) piece by piece so
that the KV allocation and the engine construction (which captures the CUDA graphs) are timed separately.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._decode_window import (  # noqa: E402  (after the sys.path line; re-exported for the baseline and tests)
    DECODE_WINDOW,
    PREFILL_TOKENS_PER_STEP,
    WARM_STEPS,
    decode_window_tokens,
    prefill_steps,
    prefill_steps_of,
    request_budget,
)


@dataclass(frozen=True)
class GPTShape:
    """Shape of the benchmark GPT (defaults: ~202M parameters, as measured in earlier H200 runs)."""

    layers: int = 16
    hidden: int = 1024
    heads: int = 16
    vocab: int = 64
    seq: int = 2048


SMALL = GPTShape(layers=2, hidden=64, heads=4, vocab=64, seq=256)  # CPU smoke runs


def quiet_logs() -> None:
    """Keep megatron-core's per-step INFO lines out of the benchmark output."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    for noisy in ("megatron", "torch", "py.warnings", "transitions", "colo_fsm", "root"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")


def setup(device: str) -> Any:
    """World of one: NCCL on CUDA, gloo on the CPU; megatron-core's parallel state with TP=1."""
    from colo_fsm.adapters.megatron.parallel import init_distributed

    return init_distributed(1, device=device)


def sync(device: str = "cuda") -> None:
    """Wait for the GPU (no-op on the CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def machine_info(device: str) -> dict[str, Any]:
    """What ran the benchmark: its provenance (commit, date, host, load: ``bench/_provenance.py``), the torch and
    megatron-core versions, the GPU."""
    import torch

    from bench._provenance import provenance

    info: dict[str, Any] = {**provenance(), "torch": torch.__version__, "device": device}
    try:
        import megatron.core as mc

        info["megatron_core"] = getattr(mc, "__version__", "?")
    except Exception:  # pragma: no cover - reported, not fatal
        info["megatron_core"] = None
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        free, total = torch.cuda.mem_get_info()
        info["gpu_mem_total_gib"] = round(total / 2**30, 1)
    return info


def build_gpt(
    shape: GPTShape,
    device: str,
    *,
    graphs: bool,
    scope: str = "layer",
    seed: int = 1234,
    reset_rng: bool = True,
    fa4_single_split: bool = True,
) -> Any:
    """The benchmark GPT (bf16 on CUDA) in eval mode; ``graphs`` turns on ``cuda_graph_impl="local"``.

    ``scope`` is ``inference_cuda_graph_scope``: ``"layer"`` (one graph per TransformerLayer, the default of
    the local impl) or ``"block"`` (one graph for the whole TransformerBlock). ``reset_rng=False`` keeps the
    RNG tracker already installed (a second model in the same process).
    """
    import torch
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from colo_fsm.adapters.megatron.model import ModelConfig, layer_spec, paged_attention_kwargs

    mcfg = ModelConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_layers=shape.layers,
        num_attention_heads=shape.heads,
        max_sequence_length=shape.seq,
        device=device,
        seed=seed,
    )
    torch.manual_seed(seed)
    if device == "cuda" and reset_rng:
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed, inference_rng_tracker=graphs, force_reset_rng=True)
    dtype = torch.bfloat16 if mcfg.use_bf16 else torch.float32
    kwargs: dict[str, Any] = dict(
        num_layers=shape.layers,
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=1,
        use_cpu_initialization=device == "cpu",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=mcfg.use_bf16,
    )
    if fa4_single_split:  # flash-attn-4 on SM 9.0 refuses split-KV: see paged_attention_kwargs
        kwargs.update(paged_attention_kwargs(device))
    if graphs:
        kwargs.update(cuda_graph_impl="local", inference_rng_tracker=True, inference_cuda_graph_scope=scope)
    tcfg = TransformerConfig(**kwargs)
    model = GPTModel(
        config=tcfg,
        transformer_layer_spec=layer_spec(mcfg),
        vocab_size=shape.vocab,
        max_sequence_length=shape.seq,
        position_embedding_type="learned_absolute",
        parallel_output=False,
        share_embeddings_and_output_weights=False,
    )
    if device == "cuda":
        model = model.cuda().bfloat16()
    model.eval()
    return model


def n_params(model: Any) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


def prompts(batch: int, length: int, vocab_lo: int = 3, vocab_hi: int = 56, seed: int = 0) -> list[list[int]]:
    """``batch`` deterministic prompts of ``length`` token ids in ``[vocab_lo, vocab_hi)``."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(vocab_lo, vocab_hi) for _ in range(length)] for _ in range(batch)]


def rollouts(n: int, lengths: Sequence[int], prompt_len: int = 32, seed: int = 0, vocab_hi: int = 56) -> list[Any]:
    """``n`` training rollouts (completion lengths cycled from ``lengths``), 4 per group, random rewards."""
    import random

    from colo_fsm.adapters.megatron.trainer import Rollout

    rng = random.Random(seed)
    out = []
    for i in range(n):
        comp = lengths[i % len(lengths)]
        out.append(
            Rollout(
                prompt_ids=tuple(rng.randrange(3, vocab_hi) for _ in range(prompt_len)),
                completion_ids=tuple(rng.randrange(3, vocab_hi) for _ in range(comp)),
                reward=rng.random(),
                group=i // 4,
            )
        )
    return out


def heavy_tail_lengths(n: int, lo: int, hi: int, seed: int = 0, alpha: float = 1.2) -> list[int]:
    """``n`` Pareto-distributed lengths clipped to ``[lo, hi]`` (most short, a few near ``hi``)."""
    import random

    rng = random.Random(seed)
    return [int(min(hi, max(lo, lo * rng.paretovariate(alpha)))) for _ in range(n)]


def median(xs: Sequence[float]) -> float | None:
    """Median, or None for no samples."""
    return statistics.median(xs) if xs else None


def failed_sections(data: dict[str, Any]) -> int:
    """A bench's exit status from its results (:class:`Results`' ``data``): 1, with the failed sections named,
    when any section failed (so the bench, and the stage that runs it, fails loudly), else 0."""
    if not data.get("errors"):
        return 0
    print("FAILED sections:", ", ".join(data["errors"]), file=sys.stderr, flush=True)
    return 1


class Results:
    """A JSON results file written after every section, so a crash keeps what was measured before it."""

    def __init__(self, path: str | Path | None, **header: Any) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, Any] = {**header, "sections": {}, "errors": {}}
        self.flush()

    def put(self, section: str, value: Any) -> None:
        self.data["sections"][section] = value
        self.flush()

    def error(self, section: str, exc: BaseException) -> None:
        self.data["errors"][section] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        self.flush()

    def flush(self) -> None:
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            os.replace(tmp, self.path)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[dict[str, Any]]:
        """Collect one section's dict; an exception is recorded (with traceback) and not raised."""
        out: dict[str, Any] = {}
        t0 = time.perf_counter()
        print(f"--- {name} ...", flush=True)
        try:
            yield out
            out["section_s"] = round(time.perf_counter() - t0, 3)
            self.put(name, out)
            print(f"--- {name} done in {out['section_s']} s", flush=True)
        except Exception as exc:  # one failed measurement must not lose the others
            out["section_s"] = round(time.perf_counter() - t0, 3)
            self.put(name, out)
            self.error(name, exc)
            print(f"--- {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()


def timed(fn: Callable[[], Any], device: str = "cuda") -> tuple[Any, float]:
    """``fn()`` and its seconds, the GPU synchronized before and after."""
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


def table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    """A markdown table of ``rows`` (missing cells as ``-``)."""

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- engine
@dataclass(frozen=True)
class EngineOptions:
    """The dynamic engine's settings used by the benchmarks."""

    mode: str = "persist"  # KVCacheManagementMode
    buffer_gb: float = 4.0
    max_requests: int = 64
    max_sequence_length: int = 2048
    block_size_tokens: int = 256
    num_cuda_graphs: int | None = None  # None: no graph pre-captured (eager decode)
    decode_only_graphs: bool = False  # use_cuda_graphs_for_non_decode_steps=False
    graph_sizing: str | None = None  # megatron's CudaGraphSizingDistribution ("linear"); None: its default


def bench_inference_config(opts: EngineOptions) -> Any:
    """megatron-core's ``InferenceConfig`` for ``opts``: the one colo-fsm's engines build from the same settings
    (raw log-probs, the last token's logits only), so a baseline decodes as they do."""
    from colo_fsm.adapters.megatron.inference_settings import megatron_inference_config

    return megatron_inference_config(
        block_size_tokens=opts.block_size_tokens,
        buffer_size_gb=opts.buffer_gb,
        max_requests=opts.max_requests,
        max_sequence_length=opts.max_sequence_length,
        kv_cache_mode=opts.mode,
        num_cuda_graphs=opts.num_cuda_graphs,
        cuda_graph_sizing=opts.graph_sizing,
        logprobs_mode="raw",
        graphs_for_mixed_steps=not opts.decode_only_graphs,
    )


class BenchEngine:
    """megatron-core's dynamic engine over ``model``, built piece by piece with timings (GPU only)."""

    def __init__(self, model: Any, tokenizer: Any, opts: EngineOptions) -> None:
        import torch
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
        from megatron.core.inference.engines.dynamic_engine import DynamicInferenceEngine
        from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import (
            GPTInferenceWrapper,
        )
        from megatron.core.inference.text_generation_controllers.text_generation_controller import (
            TextGenerationController,
        )

        self.model = model
        self.tokenizer = tokenizer
        self.opts = opts
        self.inference_config = bench_inference_config(opts)
        from colo_fsm.adapters.megatron.mode import mode_control

        # the shared model's mode switches (made before this engine captures graphs, if it is the first): suspend
        # and resume switch them as colo-fsm's engine does, so a train step in between runs in training mode
        self.mode = mode_control(model)
        self.mode.to_inference()  # decode-side switches on (graph managers back after a training phase)
        model.eval()
        mem0 = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.context = DynamicInferenceContext(model.config, self.inference_config)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        wrapper = GPTInferenceWrapper(model, self.context)
        self.controller = TextGenerationController(inference_wrapped_model=wrapper, tokenizer=tokenizer)
        t2 = time.perf_counter()
        try:
            self.engine = DynamicInferenceEngine(controller=self.controller, context=self.context)
        except BaseException:
            # a failed capture leaves graph runners bound to this context: the next engine would replay them
            if opts.num_cuda_graphs is not None:
                release_cuda_graphs(model)
            raise
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        self.build = {
            "context_kv_alloc_s": t1 - t0,
            "wrapper_controller_s": t2 - t1,
            "engine_init_incl_graph_capture_s": t3 - t2,
            "total_s": t3 - t0,
            "graphs_planned": len(self.context.cuda_graph_batch_dimensions_list),
            # the decode-only graphs' request counts: a decode step runs the smallest that holds its requests
            "decode_graph_requests": sorted(
                {d.decode_req_count for d in self.context.cuda_graph_batch_dimensions_list if not d.prefill_req_count}
            ),
            "kv_and_context_bytes": torch.cuda.memory_allocated() - mem0,
        }

    # ------------------------------------------------------------------ generation
    def sampling(
        self, max_tokens: int, *, logprobs: bool = True, stop_at_eod: bool = False, sampled: bool = False
    ) -> Any:
        """megatron's sampling parameters of a bench request: greedy (top-k 1), or with ``sampled`` drawn from the
        whole distribution at temperature 1.0 (top-k 0), as the rollouts' requests are."""
        from megatron.core.inference.sampling_params import SamplingParams

        return SamplingParams(
            temperature=1.0,
            top_k=0 if sampled else 1,  # 0: the whole distribution; 1: greedy
            num_tokens_to_generate=max_tokens,
            termination_id=self.tokenizer.eod if stop_at_eod else -1,  # -1: exact lengths
            return_log_probs=logprobs,
            skip_prompt_log_probs=True,
        )

    def generate(self, prompt_ids: Sequence[Sequence[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """Greedy generation through the engine's batch API (``engine.generate``, as ``MegatronLLM`` does)."""
        import torch

        records = self.engine.generate([list(map(int, p)) for p in prompt_ids], self.sampling(max_tokens))
        out = []
        for rec in records:
            r = rec.merge()
            toks = r.generated_tokens.tolist() if torch.is_tensor(r.generated_tokens) else list(r.generated_tokens)
            lps_raw = r.generated_log_probs
            lps = lps_raw.tolist() if torch.is_tensor(lps_raw) else list(lps_raw or [])
            out.append(([int(t) for t in toks], [float(x) for x in lps]))
        return out

    def decode_rate(
        self,
        batch: int,
        *,
        prompt_len: int = 64,
        steps: int = DECODE_WINDOW,
        warm_steps: int = WARM_STEPS,
        logprobs: bool = False,
        sampled: bool = False,
        contexts: Sequence[int] | None = None,
    ) -> dict:
        """Pure decode speed: ``batch`` requests prefilled, then ``steps`` decode steps timed.

        Every request asks for more tokens than the timed window, so the batch stays full while timed. Each request
        decodes from ``prompt_len`` tokens, or from its own of ``contexts`` (one per request); with ``logprobs``
        every step returns its tokens' log-probs, and with ``sampled`` each token is drawn from the whole
        distribution at temperature 1.0 (not greedily), as a rollout's are.
        """
        import torch

        eng = self.engine
        per_step = int(getattr(self.context, "max_tokens", 0) or PREFILL_TOKENS_PER_STEP)
        if contexts is not None and len(contexts) != batch:
            raise ValueError(f"decode_rate(batch={batch}): {len(contexts)} contexts, expected one per request")
        lengths = list(contexts) if contexts is not None else [prompt_len] * batch
        budget = request_budget(lengths, steps, warm_steps, per_step)
        if budget is None:
            raise ValueError(
                f"decode_rate(batch={batch}, prompt_len={max(lengths)}): megatron cannot prefill every prompt, "
                f"{per_step:,} tokens a step with one per admitted request decoding"
            )
        sp = self.sampling(budget, logprobs=logprobs, sampled=sampled)
        ids = (
            prompts(batch, prompt_len, seed=batch)
            if contexts is None
            else [prompts(1, n, seed=batch * 7919 + i)[0] for i, n in enumerate(lengths)]
        )
        for p in ids:
            eng.add_request(int(next(eng.request_counter)), p, sp)
        for _ in range(warm_steps):  # the first step prefills every prompt (when they fit one step's tokens)
            eng.step_modern()
        ctx = self.context
        for _ in range(1000):  # long prompts: prefill spans several steps (a step takes at most max_tokens)
            if not getattr(ctx, "num_prefill_requests", 0) and not getattr(eng, "waiting_request_ids", None):
                break
            eng.step_modern()
        before = {
            "prefill_requests": getattr(ctx, "num_prefill_requests", None),
            "decode_requests": getattr(ctx, "num_decode_requests", None),
        }
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            eng.step_modern()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        used_graph = bool(getattr(ctx, "using_cuda_graph_this_step", lambda: None)())
        after_decode = getattr(ctx, "num_decode_requests", None)
        n_finished = 0
        while eng.has_unfinished_requests():
            res = eng.step_modern()
            n_finished += len(res.get("finished_request_records", [])) if isinstance(res, dict) else 0
        return {
            "batch": batch,
            "prompt_len": prompt_len,
            "steps": steps,
            "seconds": dt,
            "step_ms": 1000 * dt / steps,
            "decode_tokens_per_s": batch * steps / dt,
            "window_start": before,
            "decode_requests_at_window_end": after_decode,
            "last_step_used_cuda_graph": used_graph,
            **({"logprobs": True} if logprobs else {}),
            **({"sampled": True} if sampled else {}),
            **({"contexts_mean": sum(lengths) / batch, "contexts_max": max(lengths)} if contexts is not None else {}),
        }

    # ------------------------------------------------------------------ lifecycle
    def suspend(self) -> None:
        """Suspend the engine, then put the shared model in training mode (as the lifecycle's suspend does)."""
        self.engine.suspend()
        self.mode.to_training()

    def resume(self) -> None:
        """Put the decode-side switches back, then resume the engine (as the lifecycle's resume does)."""
        self.mode.to_inference()
        self.engine.resume()

    def shutdown(self, *, graphs: bool) -> None:
        """Tear the engine down; with graphs, delete the layers' captured graphs (they are bound to it)."""
        import torch

        self.engine.suspend()
        if graphs:  # while the layers still hold their graph managers (to_training removes them)
            release_cuda_graphs(self.model)
        self.mode.to_training()
        self.engine = None
        self.controller = None
        self.context = None
        gc.collect()
        torch.cuda.empty_cache()


def release_cuda_graphs(model: Any) -> None:
    """Delete the captured graphs and drop the model's graph runners.

    ``delete_cuda_graphs()`` alone is not enough for an engine built again on the same model: every runner
    keeps the argument metadata of its first capture, the old inference context included, so a recapture with a
    new context fails at replay ("CUDA graph argument mismatch ... inference_context") and the old context
    (its KV buffer) stays referenced. megatron-core 0.19.2 has no public call for this; the benchmark clears
    each ``CudaGraphManager``'s runner list and lookup table, which is what a rebuild costs on top.
    """
    from megatron.core.transformer.cuda_graphs import delete_cuda_graphs

    delete_cuda_graphs()
    for m in model.modules():
        mgr = getattr(m, "cudagraph_manager", None)
        if mgr is not None:
            mgr.cudagraph_runners = []
            mgr.custom_cudagraphs_lookup_table.clear()
    gc.collect()


def graph_runner_counts(model: Any) -> dict[str, int]:
    """How many CUDA-graph runners the model's graph managers hold, and the global record sizes."""
    from megatron.core.transformer.cuda_graphs import _CudagraphGlobalRecord

    runners = 0
    training_runners = 0
    managers = 0
    for m in model.modules():
        mgr = getattr(m, "cudagraph_manager", None)
        if mgr is None:
            continue
        managers += 1
        for r in getattr(mgr, "cudagraph_runners", []):
            runners += 1
            if getattr(r, "grad_enabled", False):
                training_runners += 1
    return {
        "graph_managers": managers,
        "runners": runners,
        "grad_enabled_runners": training_runners,
        "global_training_record": len(_CudagraphGlobalRecord.cudagraph_record),
        "global_inference_record": len(_CudagraphGlobalRecord.cudagraph_inference_record),
        "training_graphs_created": bool(_CudagraphGlobalRecord.cudagraph_created),
        "saved_tensors_observer_installed": _CudagraphGlobalRecord._saved_tensors_observer is not None,
    }


def mem_snapshot(tag: str) -> dict[str, Any]:
    """Allocated / reserved / peak bytes and the device's free memory at this point."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return {
        "tag": tag,
        "allocated_gib": torch.cuda.memory_allocated() / 2**30,
        "reserved_gib": torch.cuda.memory_reserved() / 2**30,
        "max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "device_used_gib": (total - free) / 2**30,
    }


__all__ = [
    "DECODE_WINDOW",
    "PREFILL_TOKENS_PER_STEP",
    "SMALL",
    "WARM_STEPS",
    "BenchEngine",
    "EngineOptions",
    "GPTShape",
    "Results",
    "asdict",
    "build_gpt",
    "decode_window_tokens",
    "graph_runner_counts",
    "heavy_tail_lengths",
    "machine_info",
    "median",
    "mem_snapshot",
    "n_params",
    "prefill_steps",
    "prefill_steps_of",
    "prompts",
    "quiet_logs",
    "release_cuda_graphs",
    "request_budget",
    "rollouts",
    "setup",
    "sync",
    "table",
    "timed",
]
