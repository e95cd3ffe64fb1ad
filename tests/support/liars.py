"""Adapters that lie: their ``suspend()`` returns as if the engine were suspended, and it keeps serving.

The bug behind the seed authors' NCCL hangs is decode still running on the shared model while the trainer runs.
An engine that *says* it is suspended (its ``suspend()`` returns, its ``condition`` reports ``suspended``, its
request counts report its requests parked) while it keeps serving passes every check that believes the engine.
The testing kit must catch it from what it *does*: the tokens it delivers to the kit's own requests while the
lifecycle holds it suspended (:mod:`colo_fsm.testing.effects`).

Two shapes, each the shape the docs and the NeMo-RL trial use, so the kit is tried the way a user tries it:

* :func:`docs_shaped`: the docs' own toy adapters (``toy_adapters.py`` of ``docs/embedding.md``, run from the page
  itself): a ``ToyEngine`` whose ``generate`` decodes on the caller's thread and parks while suspended, its
  ``ToyTrainer``, and a ``RecordingCollector``, built as the page's "Testing your adapters" block builds them;
* :func:`nemo_shaped`: a NeMo-RL-shaped engine (a ``condition`` report, its own decode loop stepped by
  ``decode_step``, ``request_counts``, ``submit`` with ``on_token``), trainer and collector.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from colo_fsm.testing.components import Adapters, KitHandle
from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingEngine, RecordingTrainer, RequestCounts

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def docs_toy_adapters() -> types.ModuleType:
    """The ``toy_adapters.py`` block of docs/embedding.md, as a module (the page's own code, not a copy)."""
    from tests.test_docs_blocks import blocks

    (block,) = [b for b in blocks(ROOT / "docs" / "embedding.md") if b.mark == "file" and b.arg == "toy_adapters.py"]
    module = types.ModuleType("toy_adapters")
    exec(compile(block.text, f"docs/embedding.md:{block.line}", "exec"), module.__dict__)
    return module


@functools.cache
def lying_toy_engine() -> type[Any]:
    """The docs' ``ToyEngine`` with a ``suspend()`` that reports suspended and keeps serving."""
    toy = docs_toy_adapters()

    class LyingToyEngine(toy.ToyEngine):  # type: ignore[name-defined]
        """Reports its condition; ``suspend()`` says ``suspended`` and leaves decode running."""

        condition = "absent"

        def bring_up(self) -> None:
            super().bring_up()
            self.condition = "awake"

        def suspend(self) -> None:
            self.condition = "suspended"  # the lie: nothing stops, generate keeps serving

        def resume(self) -> None:
            super().resume()
            self.condition = "awake"

        def shutdown(self) -> None:
            super().shutdown()
            self.condition = "torn_down"

    return LyingToyEngine


def docs_shaped(engine_class: type[Any] | None = None) -> Callable[[KitHandle], Any]:
    """A factory of the docs' toy adapters, as the page's "Testing your adapters" block builds them (the engine
    stamps the lifecycle's weight version), with ``engine_class`` for the page's ``ToyEngine``."""
    toy = docs_toy_adapters()
    engine_cls = engine_class or toy.ToyEngine

    def make_toy_adapters(handle: KitHandle) -> Any:
        model = toy.ToyModel()
        engine = engine_cls(model, weight_version=lambda: handle.lifecycle.weight_version if handle.lifecycle else 0)
        return engine, toy.ToyTrainer(model), RecordingCollector(Journal())

    make_toy_adapters.__name__ = f"docs_shaped_{engine_cls.__name__}"
    return make_toy_adapters


class NemoShapedEngine(RecordingEngine):
    """A NeMo-RL-shaped engine: it reports its ``condition``, its loop runs one decode step per ``decode_step``,
    ``request_counts`` reports its requests, ``submit`` takes ``on_token``; an async save needs its trainer's
    finalize, and validation decodes on it."""


class LyingNemoEngine(NemoShapedEngine):
    """Its ``suspend()`` reports ``suspended`` (condition, and every request as parked) and its loop keeps
    serving every request, as if nothing had been asked of it; it does not count those decode steps either."""

    def suspend(self) -> None:
        self._call("suspend")
        if self.condition != "torn_down":
            self.condition = "suspended"  # the lie

    def submit(self, tokens: Any = None, **kwargs: Any) -> int:
        rid = super().submit(tokens, **kwargs)
        if self.condition == "suspended" and rid in self.queued:  # served at once, whatever it reported
            self.running[rid] = self.queued.pop(rid)
        return rid

    def decode_step(self, *, force: bool = False) -> int:
        if self.condition != "suspended":
            return super().decode_step(force=force)
        if not self.running:
            return 0
        for rid in list(self.running):  # the loop keeps stepping its requests; the count says nothing
            self.running[rid] -= 1
            deliver = self.on_token.get(rid)
            if self.running[rid] <= 0:
                del self.running[rid]
                self.on_token.pop(rid, None)
                self.finished.append(rid)
            if deliver is not None:
                deliver(0, 0.0, 0)
        return 1

    def request_counts(self) -> RequestCounts:
        if self.condition == "suspended":
            return RequestCounts(len(self.queued), 0, len(self.running) + len(self.parked))
        return super().request_counts()


class NemoShapedTrainer(RecordingTrainer):
    """Saves asynchronously (``finalize_checkpoint`` waits for it), as NeMo-RL's policy does."""

    async_save = True


def nemo_shaped(engine_class: type[RecordingEngine] = NemoShapedEngine) -> Callable[[], Adapters]:
    """A factory of NeMo-RL-shaped adapters (run them with ``spec=NEMO_RL``)."""

    def make_nemo_adapters() -> Adapters:
        j = Journal()
        engine = engine_class(j, urls=["http://127.0.0.1:8000/v1"])
        return Adapters(engine, NemoShapedTrainer(j), RecordingCollector(j, engine=engine))

    make_nemo_adapters.__name__ = f"nemo_shaped_{engine_class.__name__}"
    return make_nemo_adapters


__all__ = [
    "LyingNemoEngine",
    "NemoShapedEngine",
    "NemoShapedTrainer",
    "docs_shaped",
    "docs_toy_adapters",
    "lying_toy_engine",
    "nemo_shaped",
]
