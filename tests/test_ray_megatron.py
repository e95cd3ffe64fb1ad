"""Ray mode with the real megatron-core CPU adapter: two colocated worker actors, each building one tiny GPT
and putting ``MegatronEngine`` and ``MegatronTrainer`` on that same model object, forming a gloo world of two
(data parallel: each trains on its half of the batch, gradients all-reduced), driven by one single-controller
``Lifecycle`` through the Ray proxies and the collector actor."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("megatron.core")

from colo_fsm import CheckpointDecision, Lifecycle, LifecycleConfig, State  # noqa: E402
from colo_fsm.adapters.protocols import StepResult  # noqa: E402
from colo_fsm.collector.buffer import TrajectoryGroup  # noqa: E402
from colo_fsm.guards.capacity import InFlightCap  # noqa: E402
from colo_fsm.ray import (  # noqa: E402
    ColocatedFactory,
    RayCollectorProxy,
    RayDrain,
    RayEngineProxy,
    RayTextRollout,
    RayTrainerProxy,
    init_ray,
    make_collector_class,
    make_worker_class,
)
from colo_fsm.ray.fakes import numbered_prompts  # noqa: E402

pytestmark = pytest.mark.slow  # two worker processes import megatron-core (~10 s each on 2 cores)

# the factory classes below travel to the worker processes by value (the tests directory is not importable there)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORLD = 2


class GroupTrainer:
    """The megatron trainer behind a converter: the driver's batch is this rank's ``TrajectoryGroup`` shard;
    the trainer wants ``Rollout``s (prompt ids, completion ids, reward, group). Exposes the same ``model``."""

    def __init__(self, inner: Any, tokenizer: Any) -> None:
        self.inner = inner
        self.tokenizer = tokenizer

    @property
    def model(self) -> Any:
        return self.inner.model

    @property
    def steps(self) -> int:
        return int(self.inner.steps)

    def train_step(self, batch: Sequence[TrajectoryGroup]) -> StepResult:
        from colo_fsm.adapters.megatron.trainer import Rollout

        rollouts = [
            Rollout(tuple(self.tokenizer.tokenize(g.prompt)), c.token_ids, r, g.prompt_id, (), c.weight_version)
            for g in batch
            for c, r in zip(g.samples, g.rewards)
        ]
        return self.inner.train_step(rollouts)

    def offload_buffers(self) -> None:
        self.inner.offload_buffers()

    def restore_buffers(self) -> None:
        self.inner.restore_buffers()

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        self.inner.save_checkpoint(step, weight_version, extra_state)


class TinyGPT:
    """``build_model(rank)``: joins the gloo world of ``WORLD`` workers, then builds the same tiny GPT on every
    rank (same seed: data-parallel replicas)."""

    def __init__(self, init_method: str) -> None:
        self.init_method = init_method

    def __call__(self, rank: int) -> Any:
        import torch

        from colo_fsm.adapters.megatron.model import ModelConfig, build_model
        from colo_fsm.adapters.megatron.parallel import init_distributed
        from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

        init_distributed(1, rank=rank, world_size=WORLD, init_method=self.init_method, timeout_s=120)
        torch.manual_seed(0)
        tok = CharTokenizer()
        model = build_model(
            ModelConfig(
                vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_attention_heads=4, max_sequence_length=32
            )
        )
        model.colo_tokenizer = tok  # carried to the engine and trainer factories below
        return model


class MakeTrainer:
    def __init__(self, checkpoint_dir: str) -> None:
        self.checkpoint_dir = checkpoint_dir

    def __call__(self, model: Any, rank: int) -> GroupTrainer:
        from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

        trainer = MegatronTrainer(model, TrainerConfig(lr=1e-2, checkpoint_dir=self.checkpoint_dir))
        model.colo_trainer = trainer
        return GroupTrainer(trainer, model.colo_tokenizer)


def make_engine(model: Any, rank: int) -> Any:
    """The engine on the same model; completions are stamped with the rank's trainer's step count."""
    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine

    return MegatronEngine(
        model,
        model.colo_tokenizer,
        GenerationConfig(backend="cpu"),
        weight_version=lambda: model.colo_trainer.steps,  # the trainer is built right after the engine
    )


def param_sum(worker_self: Any) -> float:
    """Runs inside a worker (``__ray_call__``): a checksum of the rank's model parameters."""
    return float(sum(p.detach().double().sum() for p in worker_self.trainer.model.parameters()))


@pytest.fixture(scope="module")
def ray_session():
    # one local cluster for every Ray module of the session (tests/conftest.py shuts it down at the end)
    init_ray(num_cpus=2, include_dashboard=False)


def test_colocated_megatron_workers_train_generate_and_save_under_one_lifecycle(ray_session, tmp_path) -> None:
    from colo_fsm.adapters.megatron.checkpoint import META, latest_checkpoint, step_dir_name
    from colo_fsm.adapters.megatron.parallel import free_port

    ckpt = str(tmp_path / "ckpt")
    factory = ColocatedFactory(TinyGPT(f"tcp://127.0.0.1:{free_port()}"), make_engine, MakeTrainer(ckpt))
    workers = [make_worker_class().remote(r, factory) for r in range(WORLD)]
    actor = make_collector_class().remote(
        lambda: RayTextRollout(
            workers, lambda p, c: float(sum(map(ord, c.text)) % 7), samples_per_group=2, max_tokens=4
        ),
        numbered_prompts,
        num_prompts_per_step=4,
        max_trajectory_age_steps=1,
        cap=InFlightCap(4, 1, samples_per_group=2, control_headroom=0),
    )
    holder: dict[str, Lifecycle] = {}
    engine, trainer = RayEngineProxy(workers, control_timeout_s=300), RayTrainerProxy(workers, timeout_s=300)
    assert engine.reads_weights_in_place is True  # asked from the workers' MegatronEngine
    assert [i["engine"] for i in engine.worker_info] == ["MegatronEngine"] * WORLD
    collector = RayCollectorProxy(actor, lambda: holder["lc"].weight_version)
    lc = holder["lc"] = Lifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=3),
        drain=RayDrain(workers),
        checkpoint=CheckpointDecision(2),
        checkpoint_extra=lambda: {"replay_buffer": collector.state_dict()},
    )
    before = ray.get([w.__ray_call__.remote(param_sum) for w in workers])
    assert before[0] == before[1]  # same seed: replicas
    lc.start()
    batches = []
    while not lc.finished:
        batch = collector.sample(lc.weight_version, timeout=60)
        batches.append(batch)
        lc.step(batch)
        assert [r.consumed_samples for r in trainer.last_results] == [4, 4]  # 2 groups x 2 samples per rank
        assert lc.last_result is not None and lc.last_result.consumed_samples == 8
        assert "train/loss" in lc.last_result.metrics
    lc.stop()
    collector.close()
    assert lc.state is State.STOPPED and lc.weight_version == 3

    after = ray.get([w.__ray_call__.remote(param_sum) for w in workers])
    assert after[0] == pytest.approx(after[1], rel=1e-9, abs=1e-9)  # gradients all-reduced: still replicas
    assert after[0] != before[0]  # the shared model object was trained in place
    for g in (g for b in batches for g in b):
        # every completion was generated by a worker's MegatronEngine from a model its trainer had stepped; the
        # collector parks on pause, so a group's samples come from the version at its start or the next one
        stamps = {c.weight_version for c in g.samples}
        assert min(stamps) == g.weight_version and max(stamps) <= g.newest_version <= g.weight_version + 1, g
    assert {g.weight_version for g in batches[-1]} <= {1, 2}

    infos = ray.get([w.info.remote() for w in workers])
    health = ray.get([w.health.remote() for w in workers])
    assert len({i["pid"] for i in infos}) == WORLD and os.getpid() not in {i["pid"] for i in infos}
    assert [h["train_steps"] for h in health] == [3, 3] and [h["saves"] for h in health] == [1, 1]
    saved = latest_checkpoint(ckpt)  # one checkpoint, written by both ranks (gloo collectives between workers)
    assert saved is not None and saved.name == step_dir_name(2)
    meta = json.loads((saved / META).read_text())
    assert meta["world_size"] == WORLD and meta["weight_version"] == 2
