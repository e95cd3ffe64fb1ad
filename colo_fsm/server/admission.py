"""Admission counted in tokens: what one request costs the engine and the per-request bound.

A request costs the engine every token it makes it process: ``sum over prompts of (prompt tokens + max_tokens)
x n`` (each of the ``n`` choices prefills its prompt and decodes up to ``max_tokens``). A request over
``max_request_tokens`` (by default ``max_request_share`` of the server-wide budget) gets a 400 naming the limit
and the value. Admitted requests hold their cost in the server's
:class:`~colo_fsm.server.budget.TokenBudget` until the engine is done with them; a request that does not fit
waits there (earliest deadline first, see :mod:`colo_fsm.server.budget`) and gets a 429 with a computed
``Retry-After`` when its wait ends, or at once when ``max_waiting_requests`` wait already. Nothing is dropped
silently: every request is answered or refused with a status that says why.
"""

from __future__ import annotations

from collections.abc import Sequence

from colo_fsm.server.budget import TokenBudget
from colo_fsm.server.params import BadRequest, Sampling


def request_cost(prompt_lengths: Sequence[int], sampling: Sampling) -> int:
    """Tokens the engine processes for this request: ``sum((prompt + max_tokens) x n)`` over its prompts."""
    return sum((int(n_tok) + sampling.max_tokens) * sampling.n for n_tok in prompt_lengths)


def check_request_size(prompt_lengths: Sequence[int], sampling: Sampling, bound: int, prompt_param: str) -> int:
    """The request's cost; 400 when it is over ``bound``, naming the field at fault (``max_tokens`` when a smaller
    ``max_tokens`` could fit it, else the prompt field ``prompt_param``), the value and the limit."""
    cost = request_cost(prompt_lengths, sampling)
    if cost <= bound:
        return cost
    prompt_tokens = sum(prompt_lengths)
    param = "max_tokens" if (prompt_tokens + len(prompt_lengths)) * sampling.n <= bound else prompt_param
    raise BadRequest(
        param,
        f"this request costs the engine {cost} tokens (prompt tokens {prompt_tokens} x n {sampling.n} + "
        f"{len(prompt_lengths)} prompt(s) x n {sampling.n} x max_tokens {sampling.max_tokens}), over the "
        f"per-request limit max_request_tokens={bound}",
    )


__all__ = ["TokenBudget", "check_request_size", "request_cost"]
