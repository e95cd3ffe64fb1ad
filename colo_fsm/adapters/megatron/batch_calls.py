"""The calls both megatron-core engines (direct, :class:`~colo_fsm.adapters.megatron.engine.MegatronEngine`, and
coordinator mode, :class:`~colo_fsm.adapters.megatron.coordinator.CoordinatorEngine`) build on their ``submit``:
a batch of prompts submitted together and waited for, the text-in, text-out ``generate``, and the
medians of their handoff timings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from colo_fsm.adapters.batching import Priority, TokenCompletion, request_seed
from colo_fsm.adapters.protocols import Completion
from colo_fsm.errors import RequestTooLarge


class _Handle(Protocol):
    def result(self, timeout: float | None = None) -> TokenCompletion: ...

    def cancel(self) -> bool: ...


def submit_and_wait(
    submit: Callable[..., _Handle],
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    seed: int | None,
    max_request_tokens: int | None,
    **sampling: Any,
) -> list[TokenCompletion]:
    """``submit`` every prompt (each with its own seed derived from ``seed``), then wait for all.

    A call over ``max_request_tokens`` (prompts x ``max_tokens``) is refused before anything is submitted; a
    prompt refused on submission withdraws the ones already submitted, and a failed or interrupted wait cancels
    the others (their slots are freed).
    """
    if (
        max_request_tokens is not None
        and isinstance(max_tokens, int)
        and len(prompts) * max_tokens > max_request_tokens
    ):
        raise RequestTooLarge(
            "prompts*max_tokens",
            len(prompts) * max_tokens,
            max_request_tokens,
            f"max_request_tokens; {len(prompts)} prompt(s) x max_tokens={max_tokens}",
        )
    handles: list[_Handle] = []
    try:
        for i, p in enumerate(prompts):
            handles.append(submit(p, max_tokens=max_tokens, seed=request_seed(seed, i), **sampling))
        return [h.result() for h in handles]
    except BaseException:
        for h in handles:
            h.cancel()
        raise


def timing_medians(timings: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Median seconds of each handoff kind in ``timings`` (``("suspend"|"resume", seconds)``), as
    ``{"suspend_median_s": ..., "resume_median_s": ...}`` (a kind not seen yet is left out)."""
    out: dict[str, float] = {}
    for kind in ("suspend", "resume"):
        xs = sorted(t for k, t in timings if k == kind)
        if xs:
            out[f"{kind}_median_s"] = xs[len(xs) // 2]
    return out


def to_completion(c: TokenCompletion) -> Completion:
    """The text-protocol :class:`~colo_fsm.adapters.protocols.Completion` of a :class:`TokenCompletion`."""
    return Completion(
        text=c.text,
        token_ids=c.token_ids,
        weight_version=c.weight_version,
        finish_reason=c.finish_reason,
        weight_versions=c.weight_versions,
        logprobs=c.logprobs,
    )


class TextGeneration:
    """Mixin: the ``TextGenerator`` protocol's ``generate`` over the engine's own ``generate_ids``."""

    tokenizer: Any

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
        priority: Priority | int = Priority.TRAINING,
    ) -> list[TokenCompletion]:
        """Token ids in, completions out (each engine implements it, with options of its own)."""
        raise NotImplementedError

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
        priority: Priority | int = Priority.TRAINING,
    ) -> list[Completion]:
        """Text in, text out; completions carry per-token weight versions and log-probs."""
        ids = [self.tokenizer.tokenize(p) for p in prompts]
        outs = self.generate_ids(
            ids, max_tokens=max_tokens, temperature=temperature, seed=seed, top_p=top_p, top_k=top_k, priority=priority
        )
        return [to_completion(c) for c in outs]


__all__ = ["TextGeneration", "submit_and_wait", "timing_medians", "to_completion"]
