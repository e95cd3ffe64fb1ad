"""What a ``decode_rate`` row of the graph-decode baseline asks of megatron-core 0.19.2's dynamic engine: the engine
steps its prompts take to prefill, and the tokens each request asks for so that the batch stays whole through the
timed window (``bench/_gpu.py``'s :class:`~bench._gpu.BenchEngine` times the rows; not a benchmark itself)."""

from __future__ import annotations

from collections.abc import Sequence

PREFILL_TOKENS_PER_STEP = 16384
"""megatron-core 0.19.2's dynamic context's default ``max_tokens``: the tokens one engine step takes. Without
chunked prefill (the benches do not turn it on) a longer prompt is not prefilled: megatron marks the request failed
and steps on without it."""
DECODE_WINDOW = 64  # decode steps a decode_rate row times
WARM_STEPS = 3  # engine steps before the timed window (the first prefills every prompt that fits one step)


def prefill_steps(batch: int, prompt_len: int, per_step: int = PREFILL_TOKENS_PER_STEP) -> int | None:
    """The engine steps megatron-core 0.19.2 takes to prefill ``batch`` prompts of ``prompt_len`` tokens submitted
    together, or None when some never fits. Without chunked prefill a step takes whole prompts only, and every
    request already admitted decodes one token out of the same ``per_step``: after the first step, from 4,096
    tokens, 3 prompts fit where 4 did, so a batch of 128 takes 43 steps, not the 32 its tokens fill."""
    return prefill_steps_of([prompt_len] * batch, per_step)


def prefill_steps_of(lengths: Sequence[int], per_step: int = PREFILL_TOKENS_PER_STEP) -> int | None:
    """:func:`prefill_steps` for prompts of the given ``lengths``, admitted in order: each step takes the next
    whole prompts while they fit what the requests already admitted leave of ``per_step``."""
    admitted = steps = 0
    while admitted < len(lengths):
        room, fit = per_step - admitted, 0
        while admitted + fit < len(lengths) and lengths[admitted + fit] <= room:
            room -= lengths[admitted + fit]
            fit += 1
        if fit == 0:
            return None
        admitted += fit
        steps += 1
    return steps


def decode_window_tokens(
    batch: int,
    prompt_len: int,
    steps: int = DECODE_WINDOW,
    warm_steps: int = WARM_STEPS,
    per_step: int = PREFILL_TOKENS_PER_STEP,
) -> int | None:
    """The new tokens each of ``batch`` requests asks for in :meth:`BenchEngine.decode_rate`: the warm-up, the steps
    that prefill every prompt (:func:`prefill_steps`: the first request admitted decodes through all of them), the
    timed window and 4 to spare, so the batch stays full while timed; None when the batch cannot all be prefilled."""
    return request_budget([prompt_len] * batch, steps, warm_steps, per_step)


def request_budget(
    lengths: Sequence[int],
    steps: int = DECODE_WINDOW,
    warm_steps: int = WARM_STEPS,
    per_step: int = PREFILL_TOKENS_PER_STEP,
) -> int | None:
    """:func:`decode_window_tokens` for prompts of the given ``lengths`` (:func:`prefill_steps_of`); prompts of
    more than one length get their prefill steps again to spare, since the order megatron admits them in may take
    more steps than the count's. None when some prompt can never be prefilled."""
    prefill = prefill_steps_of(lengths, per_step)
    if prefill is None:
        return None
    spare = 4 + (prefill if len(set(lengths)) > 1 else 0)
    return warm_steps + prefill + steps + spare
