"""The CPU generation path: a token-step loop over the *same* megatron-core model object.

megatron-core's dynamic engine needs flash-attention (a GPU), and its static engine allocates on
``torch.cuda.current_device()``; on a machine without a GPU the engine adapter runs this loop instead.
:class:`CpuStepLoop` is a :class:`~colo_fsm.adapters.batching.StepBackend`: every step runs one forward over all
active requests (left-padded into one batch) and samples one token for each; requests join and leave between
steps. It recomputes the whole (short) sequence each step, with no KV cache, so a suspended request keeps only
its tokens and continues under whatever weights the model has at the resume.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from colo_fsm.adapters.batching import BackendRequest, StepOutput
from colo_fsm.errors import ConfigError, LifecycleError
from colo_fsm.guards.sampling import SamplingStream


@dataclass(frozen=True)
class Generated:
    """One generated continuation: prompt ids, new token ids, their log-probs and why it stopped."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # "stop" (end-of-document produced) or "length"


def attention_inputs(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids and megatron-convention attention mask (True = masked out) for a left-padded batch.

    ``valid`` is ``[batch, seq]`` bool (False at padding). Pad queries may attend to themselves so no row
    of the mask is empty.
    """
    b, s = valid.shape
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    causal = torch.ones(s, s, dtype=torch.bool, device=valid.device).tril()
    allowed = causal.unsqueeze(0) & valid.unsqueeze(1)
    allowed |= torch.eye(s, dtype=torch.bool, device=valid.device).unsqueeze(0)
    return positions, ~allowed.unsqueeze(1)


class _GatherVocabShards(torch.autograd.Function):
    """All-gather the vocab shards of a tensor-parallel output on the CPU; the gradient of each rank is its own
    slice (what megatron-core's gather does on CUDA, whose buffer it allocates on ``torch.cuda.current_device()``)."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        n, rank = dist.get_world_size(group), dist.get_rank(group)
        parts = [torch.empty_like(shard) for _ in range(n)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        ctx.rank, ctx.width = rank, shard.shape[-1]
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad[..., ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width].contiguous(), None


def _cpu_tensor_parallel_group(tokens: torch.Tensor) -> Any:
    """The tensor-parallel group when ``tokens`` are on the CPU and TP > 1 (None otherwise)."""
    if tokens.is_cuda:
        return None
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_tensor_model_parallel_world_size() == 1:
        return None
    return ps.get_tensor_model_parallel_group()


_CPU_GATHER_INSTALLED = False


def _install_cpu_vocab_gather() -> None:
    """Let megatron-core's output layer gather TP vocab shards of CPU tensors (its own gather allocates on
    ``torch.cuda.current_device()``, so on a CPU-only machine it cannot run at all); CUDA tensors still take
    megatron-core's path unchanged. Idempotent."""
    global _CPU_GATHER_INSTALLED
    if _CPU_GATHER_INSTALLED:
        return
    from megatron.core.tensor_parallel import layers

    original = layers.gather_from_tensor_model_parallel_region

    def gather(input_: torch.Tensor, group: Any = None) -> torch.Tensor:
        if input_.is_cuda:
            return original(input_, group)
        from megatron.core import parallel_state as ps

        group = group if group is not None else ps.get_tensor_model_parallel_group()
        return _GatherVocabShards.apply(input_, group)

    layers.gather_from_tensor_model_parallel_region = gather
    _CPU_GATHER_INSTALLED = True


def forward_logits(model: Any, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits ``[batch, seq, vocab]`` (fp32) of ``tokens`` under the padding mask.

    On the CPU with TP > 1 the vocab shards are gathered by :class:`_GatherVocabShards` (megatron-core's own
    gather needs CUDA).
    """
    positions, mask = attention_inputs(valid)
    if _cpu_tensor_parallel_group(tokens) is not None:
        _install_cpu_vocab_gather()
    return model(tokens, positions, mask, runtime_gather_output=True).float()


@torch.no_grad()
def generate_tokens(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    temperature: float,
    eod: int,
    pad: int,
    max_sequence_length: int,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> list[Generated]:
    """Generate up to ``max_tokens`` tokens for each prompt (greedy when ``temperature == 0``).

    Prompts are left-padded into one batch; a row stops at ``eod``. Log-probs are of the model's
    untempered distribution (what the trainer's importance ratio compares against).
    """
    if not prompts:
        return []
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError("max_tokens", max_tokens, "a positive integer")
    if not isinstance(temperature, int | float) or temperature < 0 or not math.isfinite(temperature):
        raise ConfigError("temperature", temperature, "a finite number >= 0")
    lengths = [len(p) for p in prompts]
    if min(lengths) < 1:
        raise ConfigError("prompt", "", "at least one token per prompt")
    longest = max(lengths)
    if longest + max_tokens > max_sequence_length:
        raise ConfigError(
            "max_tokens", max_tokens, f"at most max_sequence_length - prompt length = {max_sequence_length - longest}"
        )
    b = len(prompts)
    total = longest + max_tokens
    tokens = torch.full((b, total), pad, dtype=torch.long, device=device)
    valid = torch.zeros((b, total), dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        tokens[i, longest - len(p) : longest] = torch.as_tensor(list(p), dtype=torch.long, device=device)
        valid[i, longest - len(p) : longest] = True
    done = torch.zeros(b, dtype=torch.bool, device=device)
    new_tokens: list[list[int]] = [[] for _ in range(b)]
    new_lps: list[list[float]] = [[] for _ in range(b)]
    finish = ["length"] * b
    for t in range(max_tokens):
        cur = longest + t
        logits = forward_logits(model, tokens[:, :cur], valid[:, :cur])[:, -1, :]
        logp = torch.log_softmax(logits, dim=-1)
        if temperature == 0:
            nxt = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits / float(temperature), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        lp = logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
        active = ~done
        tokens[:, cur] = torch.where(active, nxt, torch.full_like(nxt, pad))
        valid[:, cur] = active
        for i in active.nonzero().flatten().tolist():
            tok = int(nxt[i])
            new_tokens[i].append(tok)
            new_lps[i].append(float(lp[i]))
            if tok == eod:
                finish[i] = "stop"
        done |= active & (nxt == eod)
        if bool(done.all()):
            break
    return [
        Generated(tuple(int(x) for x in p), tuple(new_tokens[i]), tuple(new_lps[i]), finish[i])
        for i, p in enumerate(prompts)
    ]


def filter_logits(logits: torch.Tensor, *, top_k: int, top_p: float) -> torch.Tensor:
    """``logits`` (1-D) with everything outside the top-k and the top-p nucleus set to ``-inf``."""
    out = logits
    if top_k and top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the smallest prefix reaching top_p
        out = out.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return out


def sample_token(logits: torch.Tensor, request: BackendRequest, generator: torch.Generator | None) -> int:
    """The next token for one request: argmax at temperature 0, else a draw from the filtered, tempered softmax."""
    if request.temperature == 0:
        return int(logits.argmax())
    filtered = filter_logits(logits, top_k=request.top_k, top_p=request.top_p)
    probs = torch.softmax(filtered / float(request.temperature), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def processed_logprobs(logits: torch.Tensor, request: BackendRequest) -> torch.Tensor:
    """Log-probs (1-D) of the distribution :func:`sample_token` draws ``request``'s next token from: the
    temperature-scaled softmax over the top-k / top-p survivors (``-inf`` elsewhere); greedy (temperature 0) is
    the point mass on the argmax (the chosen token's log-prob is 0), as megatron-core's top-k 1 gives."""
    if request.temperature == 0:
        out = torch.full_like(logits, float("-inf"), dtype=torch.float32)
        out[int(logits.argmax())] = 0.0
        return out
    filtered = filter_logits(logits.float(), top_k=request.top_k, top_p=request.top_p)
    return torch.log_softmax(filtered / float(request.temperature), dim=-1)


FORWARD_OVERHEAD_TOKENS = 256
"""What one more forward call costs, in padded tokens of work: :func:`length_buckets` splits a batch only where
that saves more (on the CPU a tiny model's forward is mostly per-call Python and per-token matmuls)."""


def length_buckets(
    lengths: Sequence[int], *, overhead: int = FORWARD_OVERHEAD_TOKENS, most: int = 3
) -> list[list[int]]:
    """Row indices of ``lengths`` grouped into at most ``most`` forwards of similar length.

    The step loop has no KV cache: a forward pads every row to the batch's longest, so one long request makes
    every short row's step as costly as its own. Rows are sorted by length and the most costly group (rows x
    longest) is cut where the padded work falls most, while a cut saves more than ``overhead``. One group when
    the lengths are close, which is the common case (rollouts of one step).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups = [order] if order else []
    while len(groups) < most:
        best: tuple[int, int, int] | None = None  # (saving, group, cut)
        for g, idx in enumerate(groups):
            longest = lengths[idx[-1]]
            for k in range(1, len(idx)):
                if lengths[idx[k - 1]] == lengths[idx[k]]:
                    continue
                saving = len(idx) * longest - (k * lengths[idx[k - 1]] + (len(idx) - k) * longest)
                if saving > overhead and (best is None or saving > best[0]):
                    best = (saving, g, k)
        if best is None:
            break
        _, g, k = best
        groups[g : g + 1] = [groups[g][:k], groups[g][k:]]
    return groups


@dataclass(eq=False)
class _Row:
    request: BackendRequest
    tokens: list[int]
    generator: torch.Generator | None
    generated: int = 0


class CpuStepLoop:
    """A :class:`~colo_fsm.adapters.batching.StepBackend` on the model object itself (no KV cache).

    A request's log-probs, and its ``top_logprobs`` alternatives, are of the model's untempered distribution
    (``logprobs_mode="raw"``, the default) or of the distribution its token was sampled from
    (``logprobs_mode="processed"``: temperature, top-k and top-p applied; :func:`processed_logprobs`). A request
    with a ``seed`` samples from its own generator, so its tokens do not depend on which
    other requests share its steps; with a ``sampling`` stream, seeds are mixed with its data-parallel rank and
    unseeded requests draw from a generator of the engine's own, seeded with the stream (else torch's global
    one). ``InferenceMode`` is set while awake and cleared while suspended.
    """

    name = "cpu"

    def __init__(
        self,
        model: Any,
        *,
        eod: int,
        pad: int,
        max_sequence_length: int,
        device: Any = "cpu",
        sampling: SamplingStream | None = None,
    ) -> None:
        self.model = model
        self.eod = int(eod)
        self.pad = int(pad)
        self.max_sequence_length = int(max_sequence_length)
        self.device = torch.device(device)
        self.rows: list[_Row] = []
        self.suspended = False
        self.steps = 0
        self.sampling = sampling  # guards: one stream per data-parallel replica (colo_fsm/guards/sampling.py)
        self.forward_overhead_tokens = FORWARD_OVERHEAD_TOKENS  # length_buckets' cut rule
        self.generator: torch.Generator | None = None
        if sampling is not None:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(sampling.seed)
        self._set_inference_mode(True)

    @staticmethod
    def _set_inference_mode(active: bool) -> None:
        from megatron.core.inference.utils import InferenceMode

        InferenceMode.set_active() if active else InferenceMode.unset_active()

    def add(self, request: BackendRequest) -> None:
        """Admit ``request``: it gets its first token at the next step."""
        if len(request.prompt_ids) + request.max_tokens > self.max_sequence_length:
            raise ConfigError(
                "max_tokens", request.max_tokens, f"at most {self.max_sequence_length - len(request.prompt_ids)}"
            )
        gen = self.generator
        if request.seed is not None and request.temperature > 0:
            gen = torch.Generator(device=self.device)
            seed = int(request.seed)
            gen.manual_seed(self.sampling.request_seed(seed) if self.sampling is not None else seed)
        self.rows.append(_Row(request, list(request.prompt_ids), gen))

    @torch.no_grad()
    def step(self) -> list[StepOutput]:
        """One forward over every active request, one new token each; finished requests leave the batch."""
        if self.suspended:
            raise LifecycleError("decode step on a suspended engine (a handoff must stop at a step boundary)")
        if not self.rows:
            return []
        self.steps += 1
        logits = self._last_logits()
        logp = torch.log_softmax(logits, dim=-1)
        raw_rows = [i for i, r in enumerate(self.rows) if r.request.logprobs_mode != "processed"]
        k_max = min(max((self.rows[i].request.top_logprobs for i in raw_rows), default=0), logp.shape[-1])
        top_v = top_i = None
        if k_max > 0:  # one topk over the batch's log-softmax, cut per row to what each request asked for
            top = torch.topk(logp, k_max, dim=-1)
            top_v, top_i = top.values.tolist(), top.indices.tolist()
        outs: list[StepOutput] = []
        keep: list[_Row] = []
        for i, r in enumerate(self.rows):
            tok = sample_token(logits[i], r.request, r.generator)
            r.tokens.append(tok)
            r.generated += 1
            finished = "stop" if tok == self.eod else ("length" if r.generated >= r.request.max_tokens else None)
            alts: tuple[tuple[tuple[int, float], ...], ...] = ()
            k = r.request.top_logprobs
            if r.request.logprobs_mode == "processed":
                row = processed_logprobs(logits[i], r.request)
                lp = float(row[tok])
                if k > 0:  # the sampled distribution's most likely tokens (filtered-out ones are not offered)
                    pv, pi = torch.topk(row, min(k, row.numel()))
                    alts = (tuple((int(t), float(v)) for t, v in zip(pi.tolist(), pv.tolist()) if v > float("-inf")),)
            else:
                lp = float(logp[i, tok])
                if k > 0 and top_v is not None and top_i is not None:
                    alts = (tuple((int(t), float(v)) for t, v in zip(top_i[i][:k], top_v[i][:k])),)
            outs.append(StepOutput(r.request.request_id, (tok,), (lp,), finished, alts))
            if finished is None:
                keep.append(r)
        self.rows = keep
        return outs

    def _last_logits(self) -> torch.Tensor:
        """The next-token logits ``[rows, vocab]`` of every row, in row order: one left-padded forward per group of
        :func:`length_buckets` (a row's logits do not depend on the group it is in)."""
        parts: list[torch.Tensor] = []
        order: list[int] = []
        for idx in length_buckets([len(r.tokens) for r in self.rows], overhead=self.forward_overhead_tokens):
            longest = len(self.rows[idx[-1]].tokens)
            tokens = torch.full((len(idx), longest), self.pad, dtype=torch.long, device=self.device)
            valid = torch.zeros((len(idx), longest), dtype=torch.bool, device=self.device)
            for j, i in enumerate(idx):
                n = len(self.rows[i].tokens)
                tokens[j, longest - n :] = torch.as_tensor(self.rows[i].tokens, dtype=torch.long, device=self.device)
                valid[j, longest - n :] = True
            parts.append(forward_logits(self.model, tokens, valid)[:, -1, :])
            order.extend(idx)
        stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
        out = torch.empty_like(stacked)
        out[torch.as_tensor(order, device=stacked.device)] = stacked
        return out

    def abort(self, request_id: int) -> None:
        """Drop the request's row (a no-op if it is not here)."""
        self.rows = [r for r in self.rows if r.request.request_id != request_id]

    def active_ids(self) -> list[int]:
        """Request ids with a row in the batch (a request appears once unless it was added twice)."""
        return [r.request.request_id for r in self.rows]

    def suspend(self) -> float:
        """Keep every row (the tokens are all there is to keep); clear ``InferenceMode``."""
        t = time.perf_counter()
        self.suspended = True
        self._set_inference_mode(False)
        return time.perf_counter() - t

    def resume(self) -> float:
        """Model back in eval mode, ``InferenceMode`` set; the kept rows continue at the next step."""
        t = time.perf_counter()
        self.model.eval()
        self._set_inference_mode(True)
        self.suspended = False
        return time.perf_counter() - t

    def shutdown(self) -> None:
        """Drop every row and clear ``InferenceMode``."""
        self.rows = []
        self.suspended = True
        self._set_inference_mode(False)


__all__ = [
    "FORWARD_OVERHEAD_TOKENS",
    "CpuStepLoop",
    "Generated",
    "attention_inputs",
    "filter_logits",
    "forward_logits",
    "generate_tokens",
    "length_buckets",
    "processed_logprobs",
    "sample_token",
]
