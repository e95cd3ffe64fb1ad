"""The lifecycle machine over one of our own real adapters: the AsyncCollector (background loop, thread pool,
replay buffer), with recording engine and trainer. Each rollout checks that the engine is awake."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest

from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TrajectoryGroup
from colo_fsm.testing import Adapters, check_lifecycle, lifecycle_settings
from colo_fsm.testing.fakes import Journal, RecordingEngine, RecordingTrainer


@pytest.fixture(autouse=True)
def _quiet_logs():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


ROLLOUTS = [0]


def real_collector_adapters() -> Adapters:
    j = Journal()
    engine, trainer = RecordingEngine(j), RecordingTrainer(j)
    violations: list[str] = []
    lock = threading.Lock()

    def rollout(prompt: Prompt) -> TrajectoryGroup:
        with lock:
            ROLLOUTS[0] += 1
            if engine.condition != "awake":
                violations.append(f"rollout of {prompt.prompt_id} with the engine {engine.condition}")
        sample = Completion(text="x", token_ids=(1,), weight_version=trainer.steps)
        return TrajectoryGroup(prompt.prompt_id, prompt.text, (sample,), (1.0,), trainer.steps)

    buffer = ReplayBuffer(num_prompts_per_step=2, max_trajectory_age_steps=1)
    prompts = (Prompt(f"p{i}", "q") for i in itertools.count())
    # this fake "engine work" runs whenever the rollout runs (a real engine parks a request submitted while it is
    # suspended), so the collector drains on pause: no rollout may then run with the engine suspended
    collector = AsyncCollector(
        rollout, prompts, buffer, lambda: trainer.steps, cap=2, pause_timeout_s=10.0, inflight="drain"
    )

    def close() -> None:
        collector.close()
        assert not violations, violations[:3]

    return Adapters(
        engine, trainer, collector, collector_probe=lambda: "paused" if collector.paused else "running", close=close
    )


def test_lifecycle_machine_over_the_real_async_collector():
    check_lifecycle(real_collector_adapters, settings=lifecycle_settings("colo-fsm-dev"))
    assert ROLLOUTS[0] > 0
