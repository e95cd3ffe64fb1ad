"""Micro-batches sized by a token budget: the training step never pads a whole batch to its longest rollout.

:func:`plan_microbatches` sorts the rollouts by length (longest first) and fills each micro-batch while
``rows x longest row`` stays within the budget (length buckets: the rows of one micro-batch have similar
lengths, so little is padding). A rollout longer than the budget gets a micro-batch of its own. The plan is
deterministic (ties keep batch order), so every data-parallel rank that sees the same lengths plans the same
micro-batches.

The GRPO loss of a micro-batch is its rows' share of the whole-batch loss (each row's per-token mean, summed,
divided by the number of rows in the *whole* batch), so the micro-batch losses add up to the one-pass loss and
their gradients add up to its gradient: the step is the same, only its peak memory is bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from colo_fsm.errors import ConfigError


@dataclass(frozen=True)
class MicroBatchPlan:
    """The micro-batches of one step: row indices into the batch, longest rows first."""

    batches: tuple[tuple[int, ...], ...]
    lengths: tuple[int, ...]

    @property
    def padded_tokens(self) -> int:
        """Tokens the forward passes compute, padding included (each micro-batch pads to its own longest row)."""
        return sum(len(b) * max(self.lengths[i] for i in b) for b in self.batches)

    @property
    def real_tokens(self) -> int:
        """Tokens of the rollouts themselves."""
        return sum(self.lengths)

    @property
    def max_micro_batch_size(self) -> int:
        """Rows of the largest micro-batch."""
        return max(len(b) for b in self.batches)


def plan_microbatches(lengths: Sequence[int], token_budget: int) -> MicroBatchPlan:
    """Group row indices into micro-batches of at most ``token_budget`` padded tokens (length-bucketed).

    Raises :class:`~colo_fsm.errors.ConfigError` for an empty batch, a non-positive budget or a non-positive length.
    """
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise ConfigError("micro_batch_tokens", token_budget, "a positive integer (padded tokens per micro-batch)")
    if not lengths:
        raise ConfigError("batch", "empty", "at least one rollout")
    bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise ConfigError("rollout length", bad[0], "a positive number of tokens")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[tuple[int, ...]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]  # rows come longest first
        if current and (len(current) + 1) * longest > token_budget:
            batches.append(tuple(current))
            current = []
        current.append(i)
    if current:
        batches.append(tuple(current))
    return MicroBatchPlan(tuple(batches), tuple(int(n) for n in lengths))


__all__ = ["MicroBatchPlan", "plan_microbatches"]
