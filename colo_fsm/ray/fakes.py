"""Small picklable fakes for Ray mode: a shared model, an engine and a trainer on it, and a generator that holds.

Used by colo-fsm's own Ray tests and benchmarks, and by users checking their Ray wiring without a model. The
fakes are colocated like the real adapters: :class:`FakeEngine` and :class:`FakeTrainer` share one
:class:`FakeModel`, the trainer's step changes its weights in place (bumps ``FakeModel.version``) and every
completion is stamped with the version it was generated from.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from colo_fsm.adapters.protocols import Completion, StepResult
from colo_fsm.collector.collector import Prompt
from colo_fsm.ray.actors import WorkerAdapters


class FakeModel:
    """The weights engine and trainer share: only a version, bumped by every training step."""

    def __init__(self) -> None:
        self.version = 0


class FakeEngine:
    """An engine that only tracks its condition (awake / suspended / torn down) and counts calls.

    ``reads_weights_in_place`` is an instance attribute so tests can build a refit-style engine (False).
    """

    def __init__(self, model: FakeModel | None = None, *, reads_weights_in_place: bool = True) -> None:
        self.model = model if model is not None else FakeModel()
        self.reads_weights_in_place = reads_weights_in_place
        self.condition = "absent"
        self.calls: list[str] = []

    @property
    def weight_version(self) -> int:
        """The version of the weights generation reads now (the shared model's)."""
        return self.model.version

    def bring_up(self) -> None:
        self.calls.append("bring_up")
        self.condition = "awake"

    def suspend(self) -> None:
        self.calls.append("suspend")
        self.condition = "suspended"

    def resume(self) -> None:
        self.calls.append("resume")
        self.condition = "awake"

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.condition = "torn_down"

    def server_base_urls(self) -> Sequence[str]:
        return []


class FakeTrainer:
    """A trainer on the shared :class:`FakeModel`: each step bumps the model's version in place.

    Refuses to train while its engine is awake. With ``checkpoint_dir``, ``save_checkpoint`` writes
    ``rank<r>-step<s>.json`` there (rank, process id, versions, extra-state keys), so a test can see which
    process saved.
    """

    def __init__(self, engine: FakeEngine, rank: int = 0, checkpoint_dir: str | None = None) -> None:
        self.engine = engine
        self.model = engine.model
        self.rank = rank
        self.checkpoint_dir = checkpoint_dir
        self.steps = 0
        self.offloaded = False

    def train_step(self, batch: Any) -> StepResult:
        if self.engine.condition == "awake":
            raise RuntimeError("train_step while the engine is awake")
        self.steps += 1
        self.model.version += 1
        n = len(batch) if hasattr(batch, "__len__") else 0
        return StepResult(metrics={"train/loss": 1.0 / self.steps, "train/rank": float(self.rank)}, consumed_samples=n)

    def offload_buffers(self) -> None:
        self.offloaded = True

    def restore_buffers(self) -> None:
        self.offloaded = False

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        if self.checkpoint_dir is None:
            return
        out = Path(self.checkpoint_dir) / f"rank{self.rank}-step{step}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": self.rank,
            "pid": os.getpid(),
            "step": step,
            "weight_version": weight_version,
            "model_version": self.model.version,
            "extra_state": sorted(extra_state),
        }
        out.write_text(json.dumps(record))


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
    """A picklable ``adapters_factory``: :class:`FakeEngine` + :class:`FakeTrainer` on one :class:`FakeModel`,
    and a :class:`HoldingGenerator` (``trainer=False``: generation only)."""

    def __init__(
        self,
        hold_s: float = 0.0,
        *,
        trainer: bool = True,
        checkpoint_dir: str | None = None,
        reads_weights_in_place: bool = True,
    ) -> None:
        self.hold_s = hold_s
        self.trainer = trainer
        self.checkpoint_dir = checkpoint_dir
        self.reads_weights_in_place = reads_weights_in_place

    def __call__(self, rank: int) -> WorkerAdapters:
        engine = FakeEngine(FakeModel(), reads_weights_in_place=self.reads_weights_in_place)
        trainer = FakeTrainer(engine, rank, self.checkpoint_dir) if self.trainer else None
        return WorkerAdapters(engine, trainer, HoldingGenerator(engine, self.hold_s))


def numbered_prompts() -> Iterator[Prompt]:
    """An endless, picklable-by-reference prompt source: ``Prompt("q0", "question 0")``, ..."""
    return (Prompt(f"q{i}", f"question {i}") for i in itertools.count())


def text_length_reward(prompt: Prompt, completion: Completion) -> float:
    """A toy reward: the completion's length."""
    return float(len(completion.text))


__all__ = [
    "FakeEngine",
    "FakeModel",
    "FakeTrainer",
    "HoldingGenerator",
    "HoldingWorkerFactory",
    "numbered_prompts",
    "text_length_reward",
]
