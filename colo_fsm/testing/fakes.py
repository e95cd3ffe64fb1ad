"""Recording fakes of the three adapters: they do nothing but record every call, in one shared journal.

Use them to unit-test a loop or a lifecycle variant, and as the reference adapters the property-based
lifecycle machine runs against. A fake can be told to raise or hang in any method (fault injection).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.adapters.protocols import StepResult


@dataclass
class Journal:
    """Calls made to the fakes, in order: ``(component, method, weight_version_seen)`` tuples."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, component: str, method: str) -> None:
        with self.lock:
            self.calls.append((component, method))

    def methods(self, component: str | None = None) -> list[str]:
        """Method names called (on one component, or ``component.method`` for all)."""
        return [m if component else f"{c}.{m}" for c, m in self.calls if component in (None, c)]

    def count(self, component: str, method: str) -> int:
        return sum(1 for c, m in self.calls if c == component and m == method)


class _Faulty:
    component = "?"

    def __init__(self, journal: Journal | None = None) -> None:
        self.journal = journal or Journal()
        self.faults: dict[str, BaseException] = {}
        self.hangs: dict[str, float] = {}

    def fail_on(self, method: str, exc: BaseException | None = None) -> None:
        """Make the next call of ``method`` raise ``exc`` (a RuntimeError by default)."""
        self.faults[method] = exc or RuntimeError(f"injected fault in {self.component}.{method}")

    def hang_on(self, method: str, seconds: float) -> None:
        """Make the next call of ``method`` sleep ``seconds`` first."""
        self.hangs[method] = seconds

    def _call(self, method: str) -> None:
        self.journal.add(self.component, method)
        if method in self.hangs:
            time.sleep(self.hangs.pop(method))
        if method in self.faults:
            raise self.faults.pop(method)


class RecordingEngine(_Faulty):
    """A fake colocated engine that tracks its own condition and refuses impossible calls."""

    component = "engine"

    def __init__(self, journal: Journal | None = None, *, reads_weights_in_place: bool = True,
                 urls: Sequence[str] = ()) -> None:
        super().__init__(journal)
        self.reads_weights_in_place = reads_weights_in_place
        self.urls = list(urls)
        self.builds = 0
        self.condition = "absent"

    def bring_up(self) -> None:
        self._call("bring_up")
        self.builds += 1
        self.condition = "awake"

    def suspend(self) -> None:
        self._call("suspend")
        if self.condition != "torn_down":
            self.condition = "suspended"

    def resume(self) -> None:
        self._call("resume")
        if self.condition in ("absent", "torn_down"):
            raise RuntimeError(f"resume of an engine that is {self.condition}")
        self.condition = "awake"

    def shutdown(self) -> None:
        self._call("shutdown")
        self.condition = "torn_down"

    def server_base_urls(self) -> Sequence[str]:
        return list(self.urls)


class RecordingTrainer(_Faulty):
    """A fake trainer: counts steps and saves, keeps saved checkpoints in memory."""

    component = "trainer"

    def __init__(self, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.steps = 0
        self.saves: list[tuple[int, int, Mapping[str, Any]]] = []

    def train_step(self, batch: Any) -> StepResult:
        self._call("train_step")
        self.steps += 1
        n = len(batch) if hasattr(batch, "__len__") else 0
        return StepResult(metrics={"loss": 1.0 / self.steps}, consumed_samples=n)

    def offload_buffers(self) -> None:
        self._call("offload_buffers")

    def restore_buffers(self) -> None:
        self._call("restore_buffers")

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        self._call("save_checkpoint")
        self.saves.append((step, weight_version, dict(extra_state)))


class RecordingCollector(_Faulty):
    """A fake collector that tracks whether it is paused."""

    component = "collector"

    def __init__(self, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.running = False

    def pause(self) -> None:
        self._call("pause")
        self.running = False

    def resume(self) -> None:
        self._call("resume")
        self.running = True


class RecordingDrain:
    """A drain that records which device it synchronized (always the one it was built for)."""

    def __init__(self, journal: Journal | None = None, local_rank: int = 0) -> None:
        self.journal = journal or Journal()
        self.local_rank = local_rank
        self.drained: list[int] = []

    def __call__(self) -> int:
        self.journal.add("device", "drain")
        self.drained.append(self.local_rank)
        return self.local_rank


def recording_adapters(*, urls: Sequence[str] = ()) -> tuple[Journal, RecordingEngine, RecordingTrainer,
                                                             RecordingCollector, RecordingDrain]:
    """One journal and the four recording fakes writing to it."""
    j = Journal()
    return j, RecordingEngine(j, urls=urls), RecordingTrainer(j), RecordingCollector(j), RecordingDrain(j)


__all__ = [
    "Journal",
    "RecordingCollector",
    "RecordingDrain",
    "RecordingEngine",
    "RecordingTrainer",
    "recording_adapters",
]
