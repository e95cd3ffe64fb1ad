"""A toy "third-party" engine, trainer and collector, to show how to test your own adapters with colo-fsm.

The engine is asyncio-based (its lifecycle methods are coroutines, as many serving stacks are); the trainer and
collector are plain. Each keeps its own notion of state, and exposes it through a small probe so the lifecycle
machine can compare what the adapter *really* is with what the lifecycle declares.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from colo_fsm.adapters.protocols import StepResult
from colo_fsm.testing import Adapters


class ToyEngine:
    """Serves from the trainer's weights in place; suspend/resume are coroutines."""

    reads_weights_in_place = True
    _PROBE = {"down": "absent", "serving": "awake", "paused": "suspended", "stopped": "torn_down"}

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = weights
        self.mode = "down"
        self.builds = 0

    async def bring_up(self) -> None:
        await asyncio.sleep(0)
        self.builds += 1
        self.mode = "serving"

    async def suspend(self) -> None:
        await asyncio.sleep(0)  # e.g. wait for the running decode batch to finish
        if self.mode != "stopped":
            self.mode = "paused"

    async def resume(self) -> None:
        await asyncio.sleep(0)
        if self.mode in ("down", "stopped"):
            raise RuntimeError(f"cannot resume an engine that is {self.mode}")
        self.mode = "serving"

    def shutdown(self) -> None:
        self.mode = "stopped"

    def server_base_urls(self) -> Sequence[str]:
        return ["http://127.0.0.1:9000/v1"]

    def probe(self) -> str:
        """The engine's condition in colo-fsm's words."""
        return self._PROBE[self.mode]


class ToyTrainer:
    """One float weight; a step adds the batch size; checkpoints go to a dict."""

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = weights
        self.buffers_on_device = False
        self.checkpoints: dict[int, dict[str, Any]] = {}

    def train_step(self, batch: Any) -> StepResult:
        self.weights["w"] += len(batch) if hasattr(batch, "__len__") else 1
        return StepResult(metrics={"w": self.weights["w"]}, consumed_samples=len(batch) if batch else 0)

    def offload_buffers(self) -> None:
        self.buffers_on_device = False

    def restore_buffers(self) -> None:
        self.buffers_on_device = True

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        self.checkpoints[step] = {"w": self.weights["w"], "weight_version": weight_version, **extra_state}


class ToyCollector:
    """Issues rollouts while running."""

    def __init__(self) -> None:
        self.issuing = False

    def pause(self) -> None:
        self.issuing = False

    def resume(self) -> None:
        self.issuing = True

    def probe(self) -> str:
        return "running" if self.issuing else "paused"


def make_toy_adapters(engine_class: type[ToyEngine] = ToyEngine) -> Adapters:
    """A fresh set of toy adapters sharing one weight dict, with probes of their real conditions."""
    weights = {"w": 0.0}
    engine, collector = engine_class(weights), ToyCollector()
    return Adapters(engine, ToyTrainer(weights), collector, engine_probe=engine.probe, collector_probe=collector.probe)


class ForgetfulToyEngine(ToyEngine):
    """A buggy variant: suspend() returns without pausing decode."""

    async def suspend(self) -> None:
        await asyncio.sleep(0)
