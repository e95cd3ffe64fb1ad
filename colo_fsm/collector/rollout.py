"""What the collector calls for one prompt: the rollout function's type and a ready-made rollout over a text generator.

A rollout turns one :class:`~colo_fsm.collector.prompts.Prompt` into a
:class:`~colo_fsm.collector.buffer.TrajectoryGroup`; :class:`~colo_fsm.collector.collector.AsyncCollector` runs it
in the background and tags the group with the weight versions and the step meant to consume it.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

from colo_fsm.adapters.protocols import Completion, TextGenerator
from colo_fsm.collector.buffer import TrajectoryGroup
from colo_fsm.collector.prompts import Prompt
from colo_fsm.errors import ConfigError

RolloutFn = Callable[[Prompt], TrajectoryGroup] | Callable[[Prompt], Awaitable[TrajectoryGroup]]
"""Prompt in, trajectory group out (sync or async). Its ``weight_version``/``target_step`` are set by the collector."""


class TextRollout:
    """A ready-made rollout over a :class:`~colo_fsm.adapters.protocols.TextGenerator`.

    Generates ``samples_per_group`` completions of the prompt in one ``generate`` call and scores each with
    ``reward_fn(prompt, completion) -> float``.
    """

    def __init__(
        self,
        generator: TextGenerator,
        reward_fn: Callable[[Prompt, Completion], float],
        *,
        samples_per_group: int,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> None:
        if not callable(getattr(generator, "generate", None)):
            raise ConfigError("generator", generator, "a TextGenerator (with generate())")
        if not callable(reward_fn):
            raise ConfigError("reward_fn", reward_fn, "a callable (prompt, completion) -> float")
        for name, v in (("samples_per_group", samples_per_group), ("max_tokens", max_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, v, "a positive integer")
        self.generator = generator
        self.reward_fn = reward_fn
        self.samples_per_group = samples_per_group
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        self._calls = itertools.count()

    def __call__(self, prompt: Prompt) -> TrajectoryGroup:
        """Generate and score one group (``weight_version`` is the oldest version among the completions)."""
        seed = None if self.seed is None else self.seed + next(self._calls)
        outs = self.generator.generate(
            [prompt.text] * self.samples_per_group, max_tokens=self.max_tokens, temperature=self.temperature, seed=seed
        )
        rewards = [float(self.reward_fn(prompt, c)) for c in outs]
        version = min((c.weight_version for c in outs), default=0)
        return TrajectoryGroup(
            prompt.prompt_id,
            prompt.text,
            tuple(outs),
            tuple(rewards),
            weight_version=version,
            metadata=dict(prompt.metadata),
        )


__all__ = ["RolloutFn", "TextRollout"]
