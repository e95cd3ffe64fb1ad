"""The demo's verifiable task: reverse a short string of digits (``"384>"`` -> ``"483"`` then end-of-document).

The reward is dense enough for a policy trained from scratch by RL alone: the fraction of target positions
(the reversed digits, then the end token) that match, minus a small penalty for a wrong length.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from colo_fsm.collector import Prompt
from colo_fsm.errors import ConfigError

ALPHABET = "0123456789>"


@dataclass(frozen=True)
class ReverseTask:
    """Prompts of ``num_digits`` random digits followed by ``>``; the answer is the digits reversed."""

    num_digits: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.num_digits, bool) or not isinstance(self.num_digits, int) or not 1 <= self.num_digits <= 12:
            raise ConfigError("num_digits", self.num_digits, "an integer in [1, 12]")

    @property
    def max_tokens(self) -> int:
        """Tokens a completion may use: the answer plus the end token."""
        return self.num_digits + 1

    def make_prompt(self, rng: random.Random, prompt_id: str) -> Prompt:
        """A random prompt; its answer travels in ``metadata["answer"]``."""
        digits = "".join(rng.choice("0123456789") for _ in range(self.num_digits))
        return Prompt(prompt_id, digits + ">", {"answer": digits[::-1]})

    @staticmethod
    def answer_of(prompt_text: str) -> str:
        """The correct completion text of ``prompt_text``."""
        return prompt_text.rstrip(">")[::-1]

    @staticmethod
    def reward(answer_ids: Sequence[int], completion_ids: Sequence[int], eod: int) -> float:
        """Fraction of target positions matched (the end token counts as one), minus 0.1 per unit of length
        error relative to the target length."""
        target = [*answer_ids, eod]
        hits = sum(1 for a, b in zip(completion_ids, target) if a == b)
        return hits / len(target) - 0.1 * abs(len(completion_ids) - len(target)) / len(target)


class PromptStream(Iterator[Prompt]):
    """An endless, reproducible stream of task prompts; ``index`` (prompts drawn) is checkpointed so a
    resumed run continues where the saved one stopped."""

    def __init__(self, task: ReverseTask, seed: int, index: int = 0) -> None:
        self.task = task
        self.seed = seed
        self.index = 0
        self._rng = random.Random(seed)
        for _ in range(index):
            next(self)

    def __next__(self) -> Prompt:
        p = self.task.make_prompt(self._rng, f"s{self.seed}-p{self.index}")
        self.index += 1
        return p

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the seed and how many prompts were drawn."""
        return {"seed": self.seed, "index": self.index}


def validation_prompts(task: ReverseTask, n: int, seed: int = 2_000_003) -> list[Prompt]:
    """A fixed set of ``n`` prompts for greedy validation."""
    rng = random.Random(seed)
    return [task.make_prompt(rng, f"val-{i}") for i in range(n)]


__all__ = ["ALPHABET", "PromptStream", "ReverseTask", "validation_prompts"]
