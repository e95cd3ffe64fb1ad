"""Ray mode parks, like the in-process path: real Ray worker actors over the real megatron-core CPU engine.

A worker hands each rollout's requests to its ``MegatronEngine`` and awaits their futures; a ``suspend`` (a
control-group call) stops the engine at a decode-step boundary with those requests kept, a training step runs
on the same model object, and after ``resume`` the parked requests finish under the new weights. The engine's
steps are paced from the test (``PacedLoop``: the real CPU loop, each decode step waiting for a grant), so
"a decode step is in flight when suspend arrives" and "no step runs while suspended" are counts, not timings.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("megatron.core")

from colo_fsm.adapters.protocols import StepResult  # noqa: E402
from colo_fsm.errors import LifecycleError  # noqa: E402
from colo_fsm.ray import ColocatedFactory, init_ray, make_worker_class  # noqa: E402

# the factory classes below travel to the worker processes by value (the tests directory is not importable there)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ALPHABET = "0123456789>"
PROMPTS = ["12>", "345>", "6>", "78>", "901>", "23>"]
MAX_TOKENS = 12


class PacedLoop:
    """The real CPU step backend; each decode step waits until the test granted it (``grant``/``run_free``)."""

    def __init__(self, inner: Any) -> None:
        import threading

        self.inner = inner
        self.name = inner.name
        self._cond = threading.Condition()
        self._budget = 0
        self._free = False
        self.blocked = False  # a step is waiting for its grant

    def grant(self, n: int) -> None:
        with self._cond:
            self._budget += n
            self._cond.notify_all()

    def run_free(self) -> None:
        with self._cond:
            self._free = True
            self._cond.notify_all()

    def add(self, request: Any) -> None:
        self.inner.add(request)

    def step(self) -> Any:
        with self._cond:
            self.blocked = True
            while not self._free and self._budget <= 0:
                self._cond.wait()
            self.blocked = False
            if not self._free:
                self._budget -= 1
        return self.inner.step()

    def abort(self, request_id: int) -> None:
        self.inner.abort(request_id)

    def suspend(self) -> float:
        return self.inner.suspend()

    def resume(self) -> float:
        return self.inner.resume()

    def shutdown(self) -> None:
        self.run_free()
        self.inner.shutdown()


def build_model(rank: int) -> Any:
    """A world-of-one gloo group and a tiny GPT in the worker."""
    import torch

    from colo_fsm.adapters.megatron.model import ModelConfig, build_model
    from colo_fsm.adapters.megatron.parallel import init_distributed
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

    init_distributed(1)
    torch.manual_seed(0)
    tok = CharTokenizer(ALPHABET)
    model = build_model(
        ModelConfig(
            vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_attention_heads=4, max_sequence_length=32
        )
    )
    model.colo_tokenizer = tok
    return model


class MakeEngine:
    """A ``MegatronEngine`` (CPU backend) whose step backend is paced; versions = the rank trainer's steps."""

    def __init__(self, inflight: str = "park") -> None:
        self.inflight = inflight

    def __call__(self, model: Any, rank: int) -> Any:
        from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine

        class PacedEngine(MegatronEngine):
            def _make_backend(self) -> Any:
                return PacedLoop(super()._make_backend())

        return PacedEngine(
            model,
            model.colo_tokenizer,
            GenerationConfig(backend="cpu", inflight=self.inflight),
            weight_version=lambda: model.colo_trainer.steps,
        )


class TupleTrainer:
    """``MegatronTrainer`` on the same model; the driver sends ``(prompt_ids, completion_ids, reward, group)``."""

    def __init__(self, model: Any) -> None:
        from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

        self.inner = MegatronTrainer(model, TrainerConfig(lr=1e-2))
        self.model = model
        model.colo_trainer = self

    @property
    def steps(self) -> int:
        return int(self.inner.steps)

    def train_step(self, batch: Sequence[tuple[Any, ...]]) -> StepResult:
        from colo_fsm.adapters.megatron.trainer import Rollout

        return self.inner.train_step([Rollout(tuple(p), tuple(c), float(r), g) for p, c, r, g in batch])

    def offload_buffers(self) -> None:
        self.inner.offload_buffers()

    def restore_buffers(self) -> None:
        self.inner.restore_buffers()

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        self.inner.save_checkpoint(step, weight_version, extra_state)


def make_trainer(model: Any, rank: int) -> TupleTrainer:
    return TupleTrainer(model)


def pace(worker_self: Any, how: str, n: int = 0) -> bool:
    """Runs inside the worker (``__ray_call__``): grant ``n`` steps, run free, or ask whether a step waits."""
    backend = worker_self.gated.inner._batcher.backend
    if how == "grant":
        backend.grant(n)
    elif how == "free":
        backend.run_free()
    return bool(backend.blocked)


def completed(worker_self: Any) -> int:
    """Requests the worker's engine resolved so far (any finish reason)."""
    return int(worker_self.gated.inner._batcher.completed)


def wait_for(worker: Any, pred: Any, what: str, timeout: float = 120.0) -> dict[str, Any]:
    """Poll the worker's health until ``pred(health)``; the deadline only guards against a hang."""
    deadline = time.monotonic() + timeout
    while True:
        h = ray.get(worker.health.remote())
        if pred(h):
            return h
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {h}")
        time.sleep(0.02)


def blocked_step(worker: Any) -> None:
    deadline = time.monotonic() + 120
    while not ray.get(worker.__ray_call__.remote(pace, "ask")):
        assert time.monotonic() < deadline, "the engine never reached its next step"
        time.sleep(0.02)


TRAIN_BATCH = [((3, 4, 13), (5, 6), 1.0, 0), ((3, 4, 13), (7,), 0.0, 0)]


@pytest.fixture(scope="module")
def ray_session():
    # one local cluster for every Ray module of the session (tests/conftest.py shuts it down at the end)
    init_ray(num_cpus=2, include_dashboard=False)


@pytest.fixture(scope="module")
def worker(ray_session):
    w = make_worker_class().remote(0, ColocatedFactory(build_model, MakeEngine("park"), make_trainer))
    ray.get(w.bring_up.remote(), timeout=300)
    yield w
    ray.get(w.shutdown.remote())
    ray.kill(w)


def test_rollouts_in_flight_are_parked_across_suspend_train_resume(worker) -> None:
    h0 = ray.get(worker.health.remote())
    assert h0["inflight"] == "park" and h0["engine_steps"] == 0
    refs = [worker.generate.remote([p], MAX_TOKENS, 1.0, 100 + i) for i, p in enumerate(PROMPTS)]
    wait_for(worker, lambda h: h["requests"] == len(PROMPTS), "every rollout handed to the engine")
    blocked_step(worker)
    ray.get(worker.__ray_call__.remote(pace, "grant", 3))
    wait_for(worker, lambda h: h["engine_steps"] == 3, "three decode steps")
    blocked_step(worker)  # the 4th decode step is in flight (waiting for its grant) when suspend arrives

    suspended = worker.suspend.remote()  # control group: runs at once, waits for the step in flight to end
    ready, _ = ray.wait([suspended], timeout=1.0)
    assert not ready  # a suspend never cuts a decode step
    ray.get(worker.__ray_call__.remote(pace, "grant", 1000))  # let that step finish (and offer many more)
    ray.get(suspended)
    h = ray.get(worker.health.remote())
    assert h["engine_steps"] == 4 and h["steps_while_suspended"] == 0
    parked = h["parked"]
    assert parked >= 1 and parked + ray.get(worker.__ray_call__.remote(completed)) == len(PROMPTS), h
    assert h["gate"] != "open" and h["in_flight"] == 0  # nothing is being handed over; the rest is parked

    ray.get(worker.drain.remote())
    ray.get(worker.restore_buffers.remote())
    ray.get(worker.train_step.remote(TRAIN_BATCH))  # the model the parked requests decode from changes here
    ray.get(worker.offload_buffers.remote())
    ray.get(worker.drain.remote())
    h = ray.get(worker.health.remote())
    assert h["engine_steps"] == 4 and h["steps_while_suspended"] == 0 and h["parked"] == parked  # granted, idle
    assert h["train_steps"] == 1
    not_done = ray.wait(refs, num_returns=len(refs), timeout=0)[1]
    assert len(not_done) == parked  # the parked rollouts are not answered during the handoff

    ray.get(worker.resume.remote())
    ray.get(worker.__ray_call__.remote(pace, "free"))
    outs = [c for r in ray.get(refs, timeout=120) for c in r]
    assert len(outs) == len(PROMPTS)  # none lost, none duplicated: one completion per rollout
    spanning = [c for c in outs if c.weight_versions and c.weight_versions[-1] == 1 and c.weight_versions[0] == 0]
    assert len(spanning) == parked  # every parked rollout finished under the new weights
    for c in outs:
        assert len(c.token_ids) == len(c.weight_versions) == len(c.logprobs) and 1 <= len(c.token_ids) <= MAX_TOKENS
        assert list(c.weight_versions) == sorted(c.weight_versions) and set(c.weight_versions) <= {0, 1}
        assert c.weight_version == c.weight_versions[0] == 0  # staleness counts from the oldest token
    for c in spanning:
        assert c.weight_versions.count(0) <= 4 and c.version_span == 1  # at most 4 steps ran before the handoff
    h = ray.get(worker.health.remote())
    assert h["requests"] == h["answered"] == len(PROMPTS) and h["calls"] == h["completed"] == len(PROMPTS)
    assert h["steps_while_suspended"] == 0 and h["parked"] == 0 and h["running"] == 0
    assert ray.get(worker.__ray_call__.remote(completed)) == len(PROMPTS)


def test_a_training_call_is_refused_while_the_engine_is_awake(worker) -> None:
    assert ray.get(worker.health.remote())["gate"] == "open"
    with pytest.raises(LifecycleError, match="not suspended"):
        ray.get(worker.train_step.remote(TRAIN_BATCH))


def test_drain_option_waits_for_the_rollouts_before_suspending(ray_session) -> None:
    w = make_worker_class().remote(
        1, ColocatedFactory(build_model, MakeEngine("park"), make_trainer), inflight="drain"
    )  # the worker's own option wins over the engine's park
    try:
        ray.get(w.bring_up.remote(), timeout=300)
        refs = [w.generate.remote([p], 6, 1.0, 7 + i) for i, p in enumerate(PROMPTS[:3])]
        wait_for(w, lambda h: h["requests"] == 3, "every rollout handed to the engine")
        h = ray.get(w.health.remote())
        assert h["inflight"] == "drain" and h["in_flight"] == 3  # each rollout holds the gate until answered
        ray.get(w.__ray_call__.remote(pace, "grant", 2))
        wait_for(w, lambda h: h["engine_steps"] == 2, "two decode steps")
        suspended = w.suspend.remote()
        ready, _ = ray.wait([suspended], timeout=1.0)
        assert not ready  # drain: the suspend waits for the rollouts in flight
        ray.get(w.__ray_call__.remote(pace, "free"))
        ray.get(suspended)
        h = ray.get(w.health.remote())
        assert h["parked"] == 0 and h["answered"] == 3 and h["steps_while_suspended"] == 0
        outs = [c for r in ray.get(refs, timeout=60) for c in r]
        assert len(outs) == 3 and all(set(c.weight_versions) == {0} for c in outs)  # strictly on-policy
        steps = h["engine_steps"]
        ray.get(w.drain.remote())
        ray.get(w.restore_buffers.remote())
        ray.get(w.train_step.remote(TRAIN_BATCH))
        ray.get(w.offload_buffers.remote())
        ray.get(w.resume.remote())
        after = ray.get(w.generate.remote(["12>"], 3, 0.0, None), timeout=60)[0]
        assert set(after.weight_versions) == {1} and ray.get(w.health.remote())["engine_steps"] > steps
    finally:
        ray.get(w.shutdown.remote())
        ray.kill(w)
