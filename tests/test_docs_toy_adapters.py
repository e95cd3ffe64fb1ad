"""The docs' toy adapters (docs/embedding.md, ``toy_adapters.py``) park: a request in flight when the lifecycle
suspends the engine waits and continues after resume, never raises, so no rollout of a loop built on them is
dropped. The interleaving is forced: the first ``generate`` stops between its two decode steps until the
lifecycle's ``suspend`` has returned, then runs its second step against the suspended engine, and the
lifecycle's ``resume`` waits until that step met the engine (it holds the engine's condition lock until it
parks, or ends)."""

from __future__ import annotations

import asyncio
import logging
import threading
import types
from typing import Any

import pytest
from test_docs_blocks import ROOT, blocks

from colo_fsm import AsyncLifecycle, Lifecycle, LifecycleConfig
from colo_fsm.collector import AsyncCollector, ReplayBuffer, TextRollout
from colo_fsm.guards.drain import NoDeviceDrain

WAIT_S = 30.0  # generous bounded waits on events (a busy machine), never a timing assertion


def toy_adapters() -> types.ModuleType:
    """The ``toy_adapters.py`` block of docs/embedding.md, as a module."""
    (block,) = [b for b in blocks(ROOT / "docs" / "embedding.md") if b.mark == "file" and b.arg == "toy_adapters.py"]
    module = types.ModuleType("toy_adapters")
    exec(compile(block.text, f"docs/embedding.md:{block.line}", "exec"), module.__dict__)
    return module


def forced_engine(toy: types.ModuleType, forced_call: int) -> Any:
    """The docs' ToyEngine whose generate number ``forced_call`` (0-based) is mid-flight exactly when the
    lifecycle suspends the engine: after its first decode step it waits until ``suspend`` has returned."""

    class MidFlightAtSuspend(toy.ToyEngine):  # type: ignore[name-defined,misc]
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.mid_flight = threading.Event()  # the forced request made its first step and waits
            self.suspended = threading.Event()  # the lifecycle's suspend returned
            self.at_boundary = threading.Event()  # the forced request holds the engine at its second step
            self.forced: list[Any] = []  # what the forced request returned (or raised)
            self._calls = 0
            self._lock = threading.Lock()
            self._local = threading.local()

        def suspend(self) -> None:
            super().suspend()
            self.suspended.set()

        def resume(self) -> None:  # the lifecycle resumes only once the forced request met the suspended engine
            assert self.at_boundary.wait(WAIT_S), "the forced request never reached its second step"
            super().resume()

        def _decode(self, prompts: Any, tokens: Any, versions: Any) -> None:
            if not (getattr(self._local, "forced", False) and tokens[0]):
                return super()._decode(prompts, tokens, versions)
            self.mid_flight.set()  # between its first and second decode step
            assert self.suspended.wait(WAIT_S), "the lifecycle never suspended the engine"
            with self._cond:  # re-entrant: held until the step parks (wait releases it) or ends
                self.at_boundary.set()
                super()._decode(prompts, tokens, versions)

        def generate(self, prompts: Any, **kw: Any) -> Any:
            with self._lock:
                self._local.forced, self._calls = self._calls == forced_call, self._calls + 1
            if not self._local.forced:
                return super().generate(prompts, **kw)
            try:
                out = super().generate(prompts, **kw)
            except BaseException as exc:
                self.forced.append(exc)
                raise
            self.forced.append(out)
            return out

    return MidFlightAtSuspend


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def test_a_request_mid_flight_at_suspend_parks_and_no_rollout_is_dropped() -> None:
    toy = toy_adapters()
    engine_cls = forced_engine(toy, forced_call=4)  # the first rollout beyond the first step's four

    async def main() -> tuple[Any, Any, Any]:
        holder: dict[str, Lifecycle] = {}
        model = toy.ToyModel()
        engine = engine_cls(model, weight_version=lambda: holder["lc"].weight_version)
        buffer = ReplayBuffer(num_prompts_per_step=4, max_trajectory_age_steps=1)
        prompts = (f"prompt {i}: " for i in range(10_000))
        collector = AsyncCollector(
            TextRollout(engine, toy.toy_reward, samples_per_group=2, max_tokens=8),
            prompts,
            buffer,
            weight_version=lambda: holder["lc"].weight_version,
        )
        lc = holder["lc"] = Lifecycle(
            engine, toy.ToyTrainer(model), collector, config=LifecycleConfig(num_steps=3), drain=NoDeviceDrain()
        )
        alc = AsyncLifecycle(lc)
        await alc.start()
        assert await asyncio.to_thread(engine.mid_flight.wait, WAIT_S), "no generate reached its second step"
        while not alc.finished:
            groups = await asyncio.to_thread(buffer.sample, alc.weight_version, WAIT_S)
            await alc.step(groups)
        stats = collector.stats()  # before stop: every rollout so far finished or is still parked
        await alc.stop()
        collector.close()
        return engine, stats, lc

    engine, stats, lc = asyncio.run(main())
    assert engine.suspended.is_set() and engine.mid_flight.is_set()
    assert len(engine.forced) == 1 and not isinstance(engine.forced[0], BaseException), engine.forced
    versions = [c.weight_versions for c in engine.forced[0]]
    assert versions == [(0, 1), (0, 1)]  # one step before the handoff, one after it: parked across it
    assert stats.failed == 0 and stats.started == stats.completed + stats.deferred + stats.in_flight, stats
    assert lc.weight_version == 3 and lc.state.value == "Stopped"
