"""The testing kit tests the user's components: their batch factory and drain everywhere, factories handed the
program's handle, and no decode step blamed on a state it did not run in."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import Phase

from colo_fsm.adapters.worker_drain import DrainsOwnDevice, drain_own_device, fan_out_drain, worker_device
from colo_fsm.errors import ConfigError
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.states import NEMO_RL, State
from colo_fsm.testing.fakes import RecordingTrainer
from colo_fsm.testing.lifecycle_machine import (
    Adapters,
    KitHandle,
    RunConfig,
    check_lifecycle,
    exercise_ranks,
    lifecycle_machine,
    recording_fakes,
)
from colo_fsm.testing.profiles import lifecycle_settings

S = State
_QUICK = dict(report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate], max_examples=30)


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


class DictBatchTrainer(RecordingTrainer):
    """Takes NeMo-RL's dict batches only (a list is a TypeError, as in a real trainer)."""

    def train_step(self, batch: Any) -> Any:
        if not isinstance(batch, dict):
            raise TypeError(f"expected a dict batch, got {type(batch).__name__}")
        return super().train_step(batch)


def dict_batch(trajectories: list[int], step: int) -> dict[str, list[int]]:
    return {
        "weight_versions": list(trajectories),
        "rewards": [1] * len(trajectories),
        "step": [step] * len(trajectories),
    }


def dict_adapters() -> Adapters:
    ad = recording_fakes()
    return Adapters(ad.engine, DictBatchTrainer(ad.engine.journal), ad.collector)


class CountingDrain:
    def __init__(self, local_rank: int, handle: KitHandle) -> None:
        self.local_rank, self.handle, self.calls = local_rank, handle, 0

    def target_device(self) -> int:
        return self.local_rank

    def __call__(self) -> int:
        assert self.handle.lifecycle is not None, "drained before the lifecycle existed"
        self.calls += 1
        return self.local_rank


def test_check_ranks_uses_the_users_batch_factory_and_drain():
    drains: list[CountingDrain] = []

    def drain_factory(local_rank: int, handle: KitHandle) -> CountingDrain:
        drains.append(CountingDrain(local_rank, handle))
        return drains[-1]

    res = exercise_ranks(dict_adapters, 2, spec=NEMO_RL, batch_factory=dict_batch, drain_factory=drain_factory)
    assert res.ok and res.adapters_exercised, res.summary()
    assert len(drains) == 2 and all(d.calls > 5 for d in drains) and {d.local_rank for d in drains} == {0, 1}


def test_factories_get_the_handle_and_run_their_rules_once_the_lifecycle_exists():
    seen: dict[str, int] = {"checkpoint": 0, "validation": 0, "early_stop": 0, "validator": 0, "drain": 0}

    def decision(key: str):
        def factory(handle: KitHandle) -> LatchedDecision:
            def rule(step: int) -> bool:
                assert handle.lifecycle is not None and handle.step == step
                seen[key] += 1
                return False

            return LatchedDecision(key, rule)

        return factory

    def validator_factory(handle: KitHandle):
        def validate(step: int, weight_version: int) -> dict[str, float]:
            assert handle.lifecycle is not None and handle.lifecycle.weight_version == weight_version
            seen["validator"] += 1
            return {"reward": 1.0}

        return validate

    def drain_factory(local_rank: int, handle: KitHandle):
        def drain() -> int:
            assert handle.lifecycle is not None
            seen["drain"] += 1
            return local_rank

        return drain

    check_lifecycle(
        dict_adapters,
        settings=lifecycle_settings("colo-fsm-dev", **_QUICK),
        spec=NEMO_RL,
        batch_factory=dict_batch,
        checkpoint_factory=decision("checkpoint"),
        validation_factory=lambda handle: ValidationDecision(1),
        early_stop_factory=decision("early_stop"),
        validator_factory=validator_factory,
        drain_factory=drain_factory,
        inject_faults=False,
    )
    assert all(seen[k] for k in ("checkpoint", "validator", "drain", "early_stop")), seen


def test_colo_fsm_check_ranks_fixture_takes_the_users_components(colo_fsm_check_ranks):
    # colo_fsm_components is overridden below: the dict-taking trainer gets the dict batches
    res = colo_fsm_check_ranks(2)
    assert res.ok and res.adapters_exercised


@pytest.fixture
def colo_fsm_adapters():
    return dict_adapters


@pytest.fixture
def colo_fsm_components():
    return {"batch_factory": dict_batch}


@pytest.fixture
def colo_fsm_spec():
    return NEMO_RL


class DecodingValidator:
    """A validation that decodes on the engine (as a real one does), the step then fails at its save."""

    def __init__(self, handle: KitHandle) -> None:
        self.handle = handle

    def __call__(self, step: int, weight_version: int) -> dict[str, float]:
        engine = self.handle.extra["engine"]
        engine.submit(1)
        engine.decode_step()
        return {"reward": 1.0}


def test_a_decode_in_a_validation_before_a_failure_is_not_blamed_on_stopped():
    def factory(handle: KitHandle) -> Adapters:
        ad = recording_fakes()
        handle.extra["engine"] = ad.engine
        return ad

    machine_cls = lifecycle_machine(
        factory,
        spec=NEMO_RL,
        validator_factory=DecodingValidator,
        validation_factory=lambda: ValidationDecision(1),
        checkpoint_factory=lambda: LatchedDecision("checkpoint", lambda step: True),
    )
    m = machine_cls()
    try:
        cfg = RunConfig(
            num_steps=3,
            start_step=0,
            start_weight_version=0,
            checkpoint_every=None,
            must_save_by_s=None,
            validate_every=1,
            inline_validator=True,
            max_trajectory_age_steps=2,
            num_prompts_per_step=1,
            samples_per_group=1,
            actor_max_concurrency=16,
            control_headroom=0,
        )
        m.setup(cfg, autostart=1, first_fault=None)
        m.no_decode_while_parked()
        m.faults.arm("trainer", "save_checkpoint")  # forced: the step validates (decoding), then its save fails
        m.whole_step()
        assert m.lc.state is S.FAILED and m.ad.engine.decode_steps == 1
        m.no_decode_while_parked()
        m.stop(0)
        assert m.lc.state is S.STOPPED
        m.no_decode_while_parked()  # the validation's decode step was not in Stopped
    finally:
        m.teardown()


# ------------------------------------------------------------------------------- NeMo-RL workers' drain
def test_worker_drain_synchronizes_the_workers_own_device_and_fans_out():
    synced: list[int] = []
    assert drain_own_device(synchronize=synced.append, device_count=lambda: 8, env={"LOCAL_RANK": "5"}) == 5
    assert drain_own_device(synchronize=synced.append, device_count=lambda: 1, env={"LOCAL_RANK": "5"}) == 0
    assert drain_own_device(synchronize=synced.append, device_count=lambda: 0) == -1
    assert synced == [5, 0]
    with pytest.raises(ConfigError, match="LOCAL_RANK=9"):
        worker_device(8, {"LOCAL_RANK": "9"})

    class Worker(DrainsOwnDevice):
        pass

    assert Worker().drain() == -1  # this CPU machine has no device in flight

    class Remote:
        def __init__(self, fn):
            self.fn = fn

        def remote(self):
            return self.fn

    class Handle:
        def __init__(self, device):
            self.drain = Remote(lambda: device)

    def get(futures):
        return [f() for f in futures]

    assert fan_out_drain([Handle(0), Handle(1)], get=get)() == [0, 1]

    class Group:  # NeMo-RL's RayWorkerGroup
        def run_all_workers_single_data(self, method):
            assert method == "drain"
            return [lambda: 2, lambda: 3]

    assert fan_out_drain(Group(), get=get)() == [2, 3]
    with pytest.raises(ConfigError, match="workers"):
        fan_out_drain([])


def test_colo_fsm_check_ranks_supplies_the_agreement_a_time_rule_needs(colo_fsm_check_ranks):
    """A save_and_stop rule without agree is not refused: the thread ranks adopt rank 0's answer, so a rule that
    fires on rank 0 alone saves and ends the run on every rank at the same step (a split would hang a barrier)."""
    stopped: dict[int, int] = {}

    def checkpoint_factory(handle: KitHandle):
        def fires() -> bool:  # rank 0's own "clock" says stop at its second step; the others' never do
            lc = handle.lifecycle
            return handle.rank == 0 and lc is not None and lc.step_index >= 1

        decision = CheckpointDecision(None, save_and_stop=fires)
        original = decision.stops_run

        def stops_run(step: int) -> bool:
            if original(step):
                stopped[handle.rank] = step
            return original(step)

        decision.stops_run = stops_run  # type: ignore[method-assign]
        return decision

    res = colo_fsm_check_ranks(2, checkpoint_factory=checkpoint_factory, steps=6)
    assert res.ok and res.adapters_exercised
    assert stopped == {0: 1, 1: 1}, stopped  # both ranks ended after step 1, on rank 0's word
