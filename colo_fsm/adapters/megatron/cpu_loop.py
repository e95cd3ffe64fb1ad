"""The CPU generation path: a batched greedy/sampling loop over the *same* megatron-core model object.

megatron-core's dynamic engine needs flash-attention (a GPU), and its static engine allocates on
``torch.cuda.current_device()``; on a machine without a GPU the engine adapter runs this loop instead. It
recomputes the whole (short) sequence each step, with no KV cache, so suspend/resume has nothing to keep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from colo_fsm.errors import ConfigError


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


def forward_logits(model: Any, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits ``[batch, seq, vocab]`` (fp32) of ``tokens`` under the padding mask."""
    positions, mask = attention_inputs(valid)
    out = model(tokens, positions, mask, runtime_gather_output=True)
    return out.float()


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


__all__ = ["Generated", "attention_inputs", "forward_logits", "generate_tokens"]
