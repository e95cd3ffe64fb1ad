"""Done-when: a NeMo-RL-shaped adapter set whose engine (and server) come up in its constructor, with validation
at start (an early stop decided there too), every 2 steps and at the end, a save every 3, an early stop and async
saves, runs through the NeMo-RL order (``NEMO_RL_ENGINE_UP``) and the kit with no workaround."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import Phase

from colo_fsm.adapters.protocols import StepResult
from colo_fsm.adapters.worker_drain import DrainsOwnDevice, fan_out_drain
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states import NEMO_RL_ENGINE_UP, State
from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingEngine, RecordingTrainer
from colo_fsm.testing.lifecycle_machine import Adapters, KitHandle, check_lifecycle, exercise_ranks
from colo_fsm.testing.profiles import lifecycle_settings

S = State
SPEC = NEMO_RL_ENGINE_UP
_QUICK = dict(report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate], max_examples=40)


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


class MegatronGenerationLike(RecordingEngine):
    """Built (with its OpenAI-compatible server) in its constructor, as NeMo-RL's MegatronGeneration."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal, up=True)
        self.dp_openai_server_base_urls = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]

    def server_base_urls(self) -> list[str]:
        return list(self.dp_openai_server_base_urls)


class PolicyLike(RecordingTrainer):
    """Takes NeMo-RL's dict batches, reports the samples it consumed, saves asynchronously (finalize to wait)."""

    async_save = True

    def train_step(self, batch: Any) -> StepResult:
        if not isinstance(batch, dict):
            raise TypeError(f"a dict batch (BatchedDataDict), got {type(batch).__name__}")
        super().train_step(batch)
        return StepResult(metrics={"loss": 0.5}, consumed_samples=len(batch["input_ids"]))


def nemo_batch(trajectories: list[int], step: int) -> dict[str, list[Any]]:
    return {"input_ids": [[1, 2, 3]] * len(trajectories), "advantages": [0.0] * len(trajectories)}


class PolicyWorker(DrainsOwnDevice):
    """A Ray policy worker with the drain method the maintainer adds (here on CPU: nothing in flight)."""


class _Remote:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self) -> Any:
        return self.fn()


class _Handle:
    def __init__(self, worker: PolicyWorker) -> None:
        self.drain = _Remote(worker.drain)


def worker_drain(local_rank: int = 0, handle: KitHandle | None = None) -> Any:
    return fan_out_drain([_Handle(PolicyWorker()), _Handle(PolicyWorker())], get=list)


def nemo_adapters() -> Adapters:
    j = Journal()
    engine = MegatronGenerationLike(j)
    return Adapters(engine, PolicyLike(j), RecordingCollector(j, engine=engine))


def _run(early_stop_after: int, num_steps: int = 10):
    ad = nemo_adapters()
    validations: list[tuple[int, int]] = []

    def validator(step: int, weight_version: int) -> dict[str, float]:
        validations.append((step, weight_version))
        return {"accuracy": 0.5}

    urls: list[list[str]] = []
    lc = Lifecycle(
        ad.engine,
        ad.trainer,
        ad.collector,
        spec=SPEC,
        config=LifecycleConfig(num_steps=num_steps, val_at_start=True, val_at_end=True),
        drain=worker_drain(),
        checkpoint=CheckpointDecision(3),
        validation=ValidationDecision(2),
        validator=validator,
        early_stop=LatchedDecision("early_stop", lambda steps_trained: steps_trained == early_stop_after),
        server_urls_sink=urls.append,
    )
    lc.start()
    consumed = 0
    while not lc.finished:
        consumed += lc.step(nemo_batch([lc.weight_version] * 4, lc.step_index)).consumed_samples
    lc.stop()
    return lc, ad, validations, urls, consumed


def test_a_nemo_shaped_run_with_the_engine_built_in_its_constructor():
    lc, ad, validations, urls, consumed = _run(early_stop_after=8)
    j = ad.engine.journal
    assert lc.state is S.STOPPED and lc.weight_version == 8 and consumed == 8 * 4
    assert j.count("engine", "bring_up") == 0 and urls == [ad.engine.dp_openai_server_base_urls]
    assert validations == [(0, 0), (2, 2), (4, 4), (6, 6), (8, 8)]  # at start, every 2; step 8 stopped early
    saves = [(s, wv) for s, wv, _ in ad.trainer.saves]
    assert saves == [(3, 3), (6, 6), (8, 8)]  # every 3, and the step the early stop ended
    assert ad.trainer.pending_saves == 0 and j.count("trainer", "finalize_checkpoint") == 3
    methods = j.methods()
    for i, m in enumerate(methods):  # every async save finalized before any wake
        if m == "trainer.save_checkpoint":
            assert methods[i + 1] == "trainer.finalize_checkpoint"


def test_val_at_end_validates_the_last_step_and_never_resumes_collection():
    lc, ad, validations, _urls, _c = _run(early_stop_after=-1)
    assert lc.weight_version == 10 and validations[-1] == (10, 10)
    assert [(s, wv) for s, wv, _ in ad.trainer.saves] == [(3, 3), (6, 6), (9, 9)]


def test_an_early_stop_decided_by_the_validation_at_start_runs_no_step():
    lc, ad, validations, _urls, consumed = _run(early_stop_after=0)
    assert validations == [(0, 0)] and consumed == 0 and lc.weight_version == 0
    assert ad.engine.journal.count("trainer", "train_step") == 0 and ad.trainer.saves == []


def test_the_kit_runs_the_nemo_shaped_set_with_its_components():
    check_lifecycle(
        nemo_adapters,
        settings=lifecycle_settings("colo-fsm-dev", **_QUICK),
        spec=SPEC,
        batch_factory=nemo_batch,
        drain_factory=worker_drain,
        validator=lambda step, wv: {"accuracy": 0.5},
    )
    res = exercise_ranks(nemo_adapters, 2, spec=SPEC, batch_factory=nemo_batch, drain_factory=worker_drain)
    assert res.ok and res.adapters_exercised, res.summary()
