"""The property-based lifecycle machine over the recording fakes (CI: the colo-fsm-ci profile, >= 500 programs),
over async adapters driven from the machine's own event loop, and through AsyncLifecycle."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from hypothesis import Phase, settings

from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingEngine, RecordingTrainer
from colo_fsm.testing.lifecycle_machine import (
    STATS,
    Adapters,
    LifecycleMachine,
    check_lifecycle,
    lifecycle_test_case,
    stats_snapshot,
)
from colo_fsm.testing.profiles import CI_PROFILE, DEEP_PROFILE, DEV_PROFILE, active_profile, lifecycle_settings
from colo_fsm.testing.watch import FAULT_TARGETS
from tests.support.report import record_stats


@pytest.fixture(autouse=True)
def _quiet_lifecycle_logs():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _run(profile: str | None = None, key: str = "lifecycle_machine", **attrs) -> dict[str, int]:
    before = stats_snapshot()
    t0 = time.perf_counter()
    check_lifecycle(profile=profile, **attrs)
    after = stats_snapshot()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta["seconds"] = round(time.perf_counter() - t0, 2)
    record_stats(key, {"profile": profile or ("directed" if "settings" in attrs else active_profile()), **delta})
    return delta


def _directed(component: str, method: str, programs: int = 50) -> dict[str, int]:
    """``programs`` programs that each arm ``component.method`` first, where their configuration can call it."""
    directed = settings(lifecycle_settings(DEV_PROFILE), max_examples=programs)
    return _run(settings=directed, key=f"first_fault:{component}.{method}", first_fault=(component, method))


def test_a_directed_run_fires_the_fault_it_arms_first():
    targets = (("trainer", "restore_buffers"), ("device", "synchronize"), ("validator", "validate"))
    for component, method in (*targets, ("trainer", "save_checkpoint")):
        delta = _directed(component, method)
        assert delta.get(f"fired:{component}.{method}", 0) >= 1, delta


def test_profiles_are_registered():
    ci = settings.get_profile(CI_PROFILE)
    assert ci.max_examples >= 500 and ci.derandomize
    assert settings.get_profile(DEEP_PROFILE).max_examples >= 1000
    assert lifecycle_settings(DEV_PROFILE).max_examples == 50


def test_lifecycle_machine_over_recording_fakes():
    """Every lifecycle rule, after every step of >= 500 programs (the CI profile, whatever the env says)."""
    delta = _run(CI_PROFILE)
    assert delta["programs"] >= 500 and delta["programs"] >= settings.get_profile(CI_PROFILE).max_examples
    # every call the machine can make fail did fail at least once (a fault armed for a call that never comes
    # again must not block the others). Which calls the drawn programs reach moves with the kit's request
    # threads, so a call the draws missed gets a directed run of its own: programs that arm it first.
    missed = [t for t in FAULT_TARGETS if not delta.get(f"fired:{t[0]}.{t[1]}", 0)]
    never = [f"{c}.{m}" for c, m in missed if not _directed(c, m).get(f"fired:{c}.{m}", 0)]
    assert not never, f"fault targets that never fired: {never} ({ {k: v for k, v in delta.items() if ':' in k} })"
    # the programs went everywhere: every state reached, faults fired, requests served
    for state in (
        "Generating",
        "Draining",
        "Training",
        "Checkpointing",
        "Validating",
        "Waking",
        "Done",
        "Stopped",
        "Failed",
    ):
        assert delta.get(f"reached:{state}", 0) > 0, (state, delta)
    assert delta["failures_after_fault"] > 0 and delta["wrong_triggers"] > 0 and delta["steps_trained"] > 100


# -------------------------------------------------------------------------- async adapters
class AsyncEngine(RecordingEngine):
    """An engine whose lifecycle methods are coroutines (suspend/resume await the engine loop)."""

    async def _hop(self) -> None:
        await asyncio.sleep(0)

    async def bring_up(self) -> None:  # type: ignore[override]
        await self._hop()
        RecordingEngine.bring_up(self)

    async def suspend(self) -> None:  # type: ignore[override]
        await self._hop()
        RecordingEngine.suspend(self)

    async def resume(self) -> None:  # type: ignore[override]
        await self._hop()
        RecordingEngine.resume(self)


class AsyncCollector(RecordingCollector):
    async def pause(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        RecordingCollector.pause(self)

    async def resume(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        RecordingCollector.resume(self)


def async_adapters() -> Adapters:
    j = Journal()
    return Adapters(AsyncEngine(j), RecordingTrainer(j), AsyncCollector(j))


def test_async_adapters_run_on_the_machines_loop():
    delta = _run(DEV_PROFILE, key="lifecycle_machine_async_adapters", adapters_factory=async_adapters)
    assert delta["steps_trained"] > 0


def test_async_lifecycle_facade_with_async_adapters():
    """AsyncLifecycle runs transitions on a worker thread; async adapters hop back onto the machine's loop."""
    delta = _run(
        DEV_PROFILE, key="lifecycle_machine_async_lifecycle", adapters_factory=async_adapters, use_async_lifecycle=True
    )
    assert delta["steps_trained"] > 0


class WithoutFaults(LifecycleMachine):
    inject_faults = False


TestLifecycleMachineNoFaults = lifecycle_test_case(base=WithoutFaults, profile=DEV_PROFILE)
"""The class API: a unittest.TestCase pytest collects (fault-free programs, the dev profile)."""


def test_machine_catches_an_adapter_that_lies_about_pausing():
    """A user's collector whose pause() returns while it keeps issuing rollouts is caught."""

    class LeakyCollector(RecordingCollector):
        def pause(self) -> None:
            self._call("pause")  # forgets to stop

    def leaky() -> Adapters:
        j = Journal()
        return Adapters(RecordingEngine(j), RecordingTrainer(j), LeakyCollector(j))

    quick = lifecycle_settings(DEV_PROFILE, report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate])
    with pytest.raises(AssertionError, match="collector reports running"):
        check_lifecycle(leaky, settings=quick, inject_faults=False)


def test_machine_catches_an_engine_that_refits_instead_of_reading_in_place():
    from colo_fsm.errors import UnsupportedEngine

    def refit() -> Adapters:
        j = Journal()
        return Adapters(RecordingEngine(j, reads_weights_in_place=False), RecordingTrainer(j), RecordingCollector(j))

    with pytest.raises(UnsupportedEngine):
        check_lifecycle(refit, settings=lifecycle_settings(DEV_PROFILE, max_examples=1))
    # the synchronous mode accepts it, and the facts still hold
    check_lifecycle(refit, settings=lifecycle_settings(DEV_PROFILE, max_examples=20), async_training=False)


@pytest.mark.slow
def test_lifecycle_machine_deep():
    """make test-deep: the deep profile (thousands of random programs)."""
    profile = active_profile() if active_profile() != CI_PROFILE else DEEP_PROFILE
    delta = _run(profile, key="lifecycle_machine_deep")
    assert delta["programs"] >= 1000


@pytest.mark.slow
def test_lifecycle_machine_deep_async():
    _run(DEEP_PROFILE, key="lifecycle_machine_deep_async", adapters_factory=async_adapters, use_async_lifecycle=True)


def test_stats_are_counted():
    """STATS counts programs and firings by itself (no reliance on another test having run first)."""
    before = STATS["programs"]
    delta = _run(DEV_PROFILE, key="lifecycle_machine_stats", adapters_factory=async_adapters)
    assert STATS["programs"] > before and delta["programs"] > 0
    assert sum(v for k, v in delta.items() if k.startswith("fired:")) > 0
