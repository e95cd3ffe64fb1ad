"""Small picklable fakes for Ray mode: an engine that records its condition and a generator that holds.

Used by colo-fsm's own Ray tests and benchmarks, and by users checking their Ray wiring without a model.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator, Sequence

from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector.collector import Prompt


class FakeEngine:
    """An engine that only tracks its condition (awake / suspended / torn down) and counts calls."""

    reads_weights_in_place = True

    def __init__(self) -> None:
        self.condition = "absent"
        self.calls: list[str] = []
        self.weight_version = 0

    def bring_up(self) -> None:
        self.calls.append("bring_up")
        self.condition = "awake"

    def suspend(self) -> None:
        self.calls.append("suspend")
        self.condition = "suspended"

    def resume(self) -> None:
        self.calls.append("resume")
        self.weight_version += 1  # in-place weights changed while suspended (one training step)
        self.condition = "awake"

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.condition = "torn_down"

    def server_base_urls(self) -> Sequence[str]:
        return []


class HoldingGenerator:
    """Echoes each prompt after holding ``hold_s`` seconds (``agenerate`` awaits, ``generate`` sleeps).

    Refuses to generate unless its engine is awake, so a rollout that slipped past the gate fails loudly.
    """

    def __init__(self, engine: FakeEngine, hold_s: float = 0.0) -> None:
        self.engine = engine
        self.hold_s = hold_s

    def _out(self, prompts: Sequence[str], max_tokens: int) -> list[Completion]:
        if self.engine.condition != "awake":
            raise RuntimeError(f"generate while the engine is {self.engine.condition}")
        return [
            Completion(p[:max_tokens], tuple(range(min(len(p), max_tokens))), self.engine.weight_version)
            for p in prompts
        ]

    async def agenerate(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        self._out(prompts, max_tokens)
        if self.hold_s:
            await asyncio.sleep(self.hold_s)
        return self._out(prompts, max_tokens)

    def generate(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        self._out(prompts, max_tokens)
        if self.hold_s:
            time.sleep(self.hold_s)
        return self._out(prompts, max_tokens)


class HoldingWorkerFactory:
    """A picklable ``rank -> (engine, generator)`` factory of :class:`FakeEngine` + :class:`HoldingGenerator`."""

    def __init__(self, hold_s: float = 0.0) -> None:
        self.hold_s = hold_s

    def __call__(self, rank: int) -> tuple[FakeEngine, HoldingGenerator]:
        engine = FakeEngine()
        return engine, HoldingGenerator(engine, self.hold_s)


def numbered_prompts() -> Iterator[Prompt]:
    """An endless, picklable-by-reference prompt source: ``Prompt("q0", "question 0")``, ..."""
    return (Prompt(f"q{i}", f"question {i}") for i in itertools.count())


def text_length_reward(prompt: Prompt, completion: Completion) -> float:
    """A toy reward: the completion's length."""
    return float(len(completion.text))


__all__ = ["FakeEngine", "HoldingGenerator", "HoldingWorkerFactory", "numbered_prompts", "text_length_reward"]
