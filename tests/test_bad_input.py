"""Every public entry point fed invalid input: a typed error naming field, value and expectation; nothing changes.

Entry points whose bad input still escapes as a raw TypeError/AttributeError (outside the guards, which were
fixed) are marked ``xfail(strict=True)`` with the gap they show: they turn red once fixed, so the marker goes.
"""

from __future__ import annotations

import math
import threading

import pytest

from colo_fsm import (
    CheckpointDecision,
    DeviceDrain,
    InFlightCap,
    LatchedDecision,
    Lifecycle,
    LifecycleConfig,
    MustSaveBy,
    State,
    ThreadBarrier,
    TorchBarrier,
    ValidationDecision,
    check_parallelism,
)
from colo_fsm.errors import (
    ColoFsmError,
    ConfigError,
    GuardRejected,
    InvalidTransition,
    ParallelismMismatch,
)
from colo_fsm.testing.fakes import recording_adapters

B1 = threading.Barrier(1)


def _generation_config(**kw):
    from colo_fsm.adapters.megatron.engine import GenerationConfig

    return GenerationConfig(**kw)


def _lc(**kw):
    _j, e, t, c, d = recording_adapters()
    return Lifecycle(e, t, c, drain=d, **kw)


def _lc_no_drain(**kw):
    _j, e, t, c, _d = recording_adapters()
    return Lifecycle(e, t, c, **kw)


# (id, thunk, error type, field named in the error or None)
CASES = [
    # LifecycleConfig
    ("config.num_steps=0", lambda: LifecycleConfig(num_steps=0), ConfigError, "num_steps"),
    ("config.num_steps='3'", lambda: LifecycleConfig(num_steps="3"), ConfigError, "num_steps"),
    ("config.num_steps=2.0", lambda: LifecycleConfig(num_steps=2.0), ConfigError, "num_steps"),
    ("config.num_steps=True", lambda: LifecycleConfig(num_steps=True), ConfigError, "num_steps"),
    ("config.rank=-1", lambda: LifecycleConfig(rank=-1), ConfigError, "rank"),
    ("config.rank>=world", lambda: LifecycleConfig(rank=2, world_size=2), ConfigError, "rank"),
    ("config.world_size=0", lambda: LifecycleConfig(world_size=0), ConfigError, "world_size"),
    ("config.start_step=-1", lambda: LifecycleConfig(start_step=-1), ConfigError, "start_step"),
    ("config.start_step>=num_steps", lambda: LifecycleConfig(num_steps=2, start_step=2), ConfigError, "start_step"),
    (
        "config.start_weight_version=-1",
        lambda: LifecycleConfig(start_weight_version=-1),
        ConfigError,
        "start_weight_version",
    ),
    # Lifecycle
    ("lifecycle.world>1 without barrier", lambda: _lc(config=LifecycleConfig(world_size=2)), ConfigError, "barrier"),
    ("lifecycle.engine=None", lambda: Lifecycle(None, recording_adapters()[2]), ConfigError, "engine"),
    ("lifecycle.config={}", lambda: _lc(config={"num_steps": 3}), ConfigError, "config"),
    ("lifecycle.barrier='x'", lambda: _lc(barrier="x"), ConfigError, "barrier"),
    ("lifecycle.drain=5", lambda: _lc_no_drain(drain=5), ConfigError, "drain"),
    ("lifecycle.checkpoint=5", lambda: _lc(checkpoint=5), ConfigError, "checkpoint"),
    ("lifecycle.validation=5", lambda: _lc(validation=5), ConfigError, "validation"),
    ("lifecycle.validator=5", lambda: _lc(validator=5), ConfigError, "validator"),
    ("lifecycle.checkpoint_extra=5", lambda: _lc(checkpoint_extra=5), ConfigError, "checkpoint_extra"),
    ("lifecycle.trainer=5", lambda: Lifecycle(recording_adapters()[1], 5), ConfigError, "trainer"),
    ("lifecycle.collector=5", lambda: Lifecycle(*recording_adapters()[1:3], 5), ConfigError, "collector"),
    ("lifecycle.spec=5", lambda: _lc(spec=5), ConfigError, "spec"),
    ("config.trace_path=5", lambda: LifecycleConfig(trace_path=5), ConfigError, "trace_path"),
    ("config.async_training='no'", lambda: LifecycleConfig(async_training="no"), ConfigError, "async_training"),
    # InFlightCap
    ("cap.num_prompts=0", lambda: InFlightCap(0, 1, 1), ConfigError, "num_prompts_per_step"),
    ("cap.num_prompts='4'", lambda: InFlightCap("4", 1, 1), ConfigError, "num_prompts_per_step"),
    ("cap.num_prompts=4.0", lambda: InFlightCap(4.0, 1, 1), ConfigError, "num_prompts_per_step"),
    ("cap.age=-1", lambda: InFlightCap(1, -1, 1), ConfigError, "max_trajectory_age_steps"),
    ("cap.samples=0", lambda: InFlightCap(1, 1, 0), ConfigError, "samples_per_group"),
    ("cap.samples>capacity", lambda: InFlightCap(4, 1, 2000), ConfigError, "samples_per_group"),
    ("cap.actor=True", lambda: InFlightCap(4, 1, 1, actor_max_concurrency=True), ConfigError, "actor_max_concurrency"),
    ("cap.headroom=-1", lambda: InFlightCap(4, 1, 1, control_headroom=-1), ConfigError, "control_headroom"),
    ("cap.headroom>=actor", lambda: InFlightCap(4, 1, 1, control_headroom=1000), ConfigError, "control_headroom"),
    # decisions
    ("ckpt.every=0", lambda: CheckpointDecision(0), ConfigError, "CheckpointDecision.every_steps"),
    ("ckpt.every=-2", lambda: CheckpointDecision(-2), ConfigError, "CheckpointDecision.every_steps"),
    ("ckpt.every='2'", lambda: CheckpointDecision("2"), ConfigError, "CheckpointDecision.every_steps"),
    ("ckpt.must_save_by=-1", lambda: CheckpointDecision(must_save_by_s=-1), ConfigError, "must_save_by_s"),
    ("ckpt.must_save_by=nan", lambda: CheckpointDecision(must_save_by_s=math.nan), ConfigError, "must_save_by_s"),
    ("ckpt.must_save_by=inf", lambda: CheckpointDecision(must_save_by_s=math.inf), ConfigError, "must_save_by_s"),
    ("ckpt.must_save_by='5'", lambda: CheckpointDecision(must_save_by_s="5"), ConfigError, "must_save_by_s"),
    ("ckpt.clock='x'", lambda: CheckpointDecision(must_save_by_s=1, clock="x"), ConfigError, "clock"),
    ("ckpt.agree=5", lambda: CheckpointDecision(2, agree=5), ConfigError, "checkpoint.agree"),
    ("val.every=0", lambda: ValidationDecision(0), ConfigError, "ValidationDecision.every_steps"),
    ("val.every=1.5", lambda: ValidationDecision(1.5), ConfigError, "ValidationDecision.every_steps"),
    ("latched.rule=None", lambda: LatchedDecision("x", None), ConfigError, "x.rule"),
    ("mustsaveby=-1", lambda: MustSaveBy(-1), ConfigError, "must_save_by_s"),
    ("mustsaveby=nan", lambda: MustSaveBy(math.nan), ConfigError, "must_save_by_s"),
    ("mustsaveby=True", lambda: MustSaveBy(True), ConfigError, "must_save_by_s"),
    ("mustsaveby.clock=5", lambda: MustSaveBy(1, clock=5), ConfigError, "clock"),
    # drain
    ("drain.local_rank=-1", lambda: DeviceDrain(-1), ConfigError, "local_rank"),
    ("drain.local_rank='1'", lambda: DeviceDrain("1"), ConfigError, "local_rank"),
    ("drain.local_rank=1.0", lambda: DeviceDrain(1.0), ConfigError, "local_rank"),
    ("drain.local_rank=True", lambda: DeviceDrain(True), ConfigError, "local_rank"),
    ("drain.synchronize=5", lambda: DeviceDrain(0, synchronize=5), ConfigError, "synchronize"),
    # parallelism
    ("parallelism.training=None", lambda: check_parallelism(None, {}), ConfigError, "training_config"),
    ("parallelism.training=5", lambda: check_parallelism(5, {"tp": 2}), ConfigError, "training_config"),
    ("parallelism.generation='tp2'", lambda: check_parallelism({"tp": 2}, "tp2"), ConfigError, "generation_config"),
    (
        "parallelism.tp='2'",
        lambda: check_parallelism({"tp": "2"}, {"tp": 2}),
        ConfigError,
        "training.tensor_model_parallel_size",
    ),
    (
        "parallelism.gen tp=0",
        lambda: check_parallelism({"tp": 2}, {"tp": 0}),
        ConfigError,
        "generation.tensor_model_parallel_size",
    ),
    (
        "parallelism.tp mismatch",
        lambda: check_parallelism({"tp": 2}, {"tp": 4}),
        ParallelismMismatch,
        "tensor_model_parallel_size",
    ),
    (
        "parallelism.pp mismatch",
        lambda: check_parallelism({"pp": 2}, {"pp": 1}),
        ParallelismMismatch,
        "pipeline_model_parallel_size",
    ),
    (
        "parallelism.ep mismatch",
        lambda: check_parallelism({"ep": 8}, {"ep": 4}),
        ParallelismMismatch,
        "expert_model_parallel_size",
    ),
    (
        "parallelism.etp mismatch",
        lambda: check_parallelism({"tp": 2}, {"etp": 1}),
        ParallelismMismatch,
        "expert_tensor_parallel_size",
    ),
    # barriers
    ("thread_barrier.shared=None", lambda: ThreadBarrier(None, 0), ConfigError, "shared"),
    ("thread_barrier.rank=-1", lambda: ThreadBarrier(B1, -1), ConfigError, "rank"),
    ("thread_barrier.rank>=parties", lambda: ThreadBarrier(B1, 1), ConfigError, "rank"),
    ("thread_barrier.timeout=0", lambda: ThreadBarrier(B1, 0, timeout_s=0), ConfigError, "barrier_timeout_s"),
    ("thread_barrier.timeout=nan", lambda: ThreadBarrier(B1, 0, timeout_s=math.nan), ConfigError, "barrier_timeout_s"),
    ("thread_barrier.timeout='1'", lambda: ThreadBarrier(B1, 0, timeout_s="1"), ConfigError, "barrier_timeout_s"),
    ("torch_barrier.no process group", lambda: TorchBarrier(), ConfigError, "process_group"),
    # the engine's KV-cache mode and generation settings (megatron adapter)
    (
        "generation.kv_cache_mode='bogus'",
        lambda: _generation_config(kv_cache_mode="bogus"),
        ConfigError,
        "kv_cache_mode",
    ),
    ("generation.kv_cache_mode=3", lambda: _generation_config(kv_cache_mode=3), ConfigError, "kv_cache_mode"),
    ("generation.backend='gpu'", lambda: _generation_config(backend="gpu"), ConfigError, "backend"),
    ("generation.buffer_size_gb=-1", lambda: _generation_config(buffer_size_gb=-1), ConfigError, "buffer_size_gb"),
    (
        "generation.block_size_tokens=0",
        lambda: _generation_config(block_size_tokens=0),
        ConfigError,
        "block_size_tokens",
    ),
    (
        "generation.max_requests=-3",
        lambda: _generation_config(max_requests=-3),
        ConfigError,
        "max_requests",
    ),
    (
        "generation.tensor_model_parallel_size='2'",
        lambda: _generation_config(tensor_model_parallel_size="2"),
        ConfigError,
        "tensor_model_parallel_size",
    ),
    (
        "generation.context_parallel_size=0",
        lambda: _generation_config(context_parallel_size=0),
        ConfigError,
        "context_parallel_size",
    ),
    (
        "trainer.checkpoint_format='zip'",
        lambda: __import__("colo_fsm.adapters.megatron.trainer", fromlist=["x"]).TrainerConfig(checkpoint_format="zip"),
        ConfigError,
        "checkpoint_format",
    ),
    (
        "trainer.betas=(2,3)",
        lambda: __import__("colo_fsm.adapters.megatron.trainer", fromlist=["x"]).TrainerConfig(betas=(2, 3)),
        ConfigError,
        "betas",
    ),
    (
        "trainer.offload_optimizer_state='yes'",
        lambda: __import__("colo_fsm.adapters.megatron.trainer", fromlist=["x"]).TrainerConfig(
            offload_optimizer_state="yes"
        ),
        ConfigError,
        "offload_optimizer_state",
    ),
    (
        "model.seed='x'",
        lambda: __import__("colo_fsm.adapters.megatron.model", fromlist=["x"]).ModelConfig(seed="x"),
        ConfigError,
        "seed",
    ),
    (
        "model.bf16='x'",
        lambda: __import__("colo_fsm.adapters.megatron.model", fromlist=["x"]).ModelConfig(bf16="x"),
        ConfigError,
        "bf16",
    ),
]


@pytest.mark.parametrize(("thunk", "error", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_typed_error(thunk, error, field):
    with pytest.raises(error) as info:
        thunk()
    exc = info.value
    assert isinstance(exc, ColoFsmError)
    if field is not None:
        assert exc.field == field
        text = str(exc)
        assert field in text
        if isinstance(exc, ConfigError):
            assert "expected" in text and repr(exc.value) in text
        else:  # a mismatch names both values
            assert str(exc.training) in text and str(exc.generation) in text


def test_decide_with_a_bad_step_changes_nothing():
    d = CheckpointDecision(2)
    assert d.decide(3) is True
    for bad in (-1, "1", True, 1.0, 2):  # 2: an earlier step than the latched one
        with pytest.raises(ConfigError, match="step"):
            d.decide(bad)
    assert d.peek(3) is True and d.evaluations == 1


def test_metrics_logger_bad_values(tmp_path):
    from colo_fsm.metrics import MetricsLogger

    m = MetricsLogger(tmp_path, tensorboard=False)
    try:
        for metrics, kwargs, field in (
            ({"a": math.nan}, {}, "metrics['a']"),
            ({"a": "x"}, {}, "metrics['a']"),
            ({}, {"consumed_samples": -1}, "consumed_samples"),
        ):
            with pytest.raises(ConfigError) as info:
                m.log(1, metrics, **kwargs)
            assert info.value.field == field
        assert m.consumed_samples == 0 and m.path.read_text() == ""  # nothing written
    finally:
        m.close()


GAPS: list = []  # none open: every reported gap is fixed and listed in CASES


if GAPS:  # (id, what is missing, thunk): strict xfails that turn red once the gap is closed

    @pytest.mark.parametrize(("reason", "thunk"), [g[1:] for g in GAPS], ids=[g[0] for g in GAPS])
    def test_reported_gaps(reason, thunk, tmp_path, request):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"reported to the lead: {reason}"))
        with pytest.raises(ConfigError):
            thunk(tmp_path)


# -------------------------------------------------------------------------- triggers from the wrong state
def _snapshot(lc, journal):
    return (lc.state, len(lc.trace), list(journal.calls), lc.weight_version, lc.step_index, dict(lc.facts))


@pytest.mark.parametrize("reach", ["Created", "Generating", "Validating", "Done", "Stopped", "Failed"])
def test_every_trigger_from_the_wrong_state_is_refused_and_changes_nothing(reach):
    j, e, t, c, d = recording_adapters()
    lc = Lifecycle(
        e,
        t,
        c,
        drain=d,
        config=LifecycleConfig(num_steps=2),
        checkpoint=CheckpointDecision(None),
        validation=ValidationDecision(1),
    )
    if reach != "Created":
        lc.start()
    if reach in ("Validating", "Done"):
        lc.step([1])  # validates (no validator given): rests in Validating
    if reach == "Done":
        lc.end_validation()
        lc.step([2])
    if reach == "Stopped":
        lc.stop()
    if reach == "Failed":
        c.fail_on("pause")
        with pytest.raises(ColoFsmError):
            lc.begin_step()
    assert lc.state.value == reach
    for trigger in (*lc.spec.triggers(), "fail", "no_such_trigger", 5, None):
        if trigger in lc.spec.triggers(lc.state) and lc.can(trigger):
            continue
        before = _snapshot(lc, j)
        with pytest.raises((InvalidTransition, GuardRejected)) as info:
            lc.fire(trigger)
        assert info.value.state == reach and repr(trigger) in str(info.value)
        assert _snapshot(lc, j) == before
    # the convenience methods too (each from a state where it is not valid)
    valid = {"Created": {"start"}, "Generating": {"begin_step", "step"}, "Validating": {"end_validation"}}
    calls = {
        "start": lc.start,
        "begin_step": lc.begin_step,
        "train": lambda: lc.train([1]),
        "step": lambda: lc.step([1]),
        "end_validation": lc.end_validation,
    }
    for name, call in calls.items():
        if name in valid.get(reach, set()):
            continue
        before = _snapshot(lc, j)
        with pytest.raises(InvalidTransition):
            call()
        assert _snapshot(lc, j) == before, name


def test_a_refused_trigger_names_the_valid_ones():
    lc = _lc()
    with pytest.raises(InvalidTransition) as info:
        lc.train([1])
    assert info.value.allowed == ("start", "stop") and "start, stop" in str(info.value)
    assert lc.state is State.CREATED


# -------------------------------------------------------------------------- the testing API and the checker CLI
@pytest.mark.parametrize(
    ("thunk", "field"),
    [
        (lambda: __import__("colo_fsm.testing.checker", fromlist=["x"]).check(2, scenario="nope"), "scenario"),
        (lambda: __import__("colo_fsm.testing.checker", fromlist=["x"]).check("2"), "ranks"),
        (lambda: __import__("colo_fsm.testing.checker", fromlist=["x"]).check(0), "ranks"),
        (lambda: __import__("colo_fsm.testing.profiles", fromlist=["x"]).lifecycle_settings("nope"), "profile"),
    ],
    ids=["check.scenario", "check.ranks_str", "check.ranks_0", "profile"],
)
def test_testing_api_bad_input(thunk, field):
    with pytest.raises(ConfigError, match=field):
        thunk()


@pytest.mark.parametrize("ranks", ["x", "0..3", ""])
def test_checker_cli_bad_ranks_is_a_usage_error(ranks, capsys):
    from colo_fsm.testing.checker import main

    with pytest.raises(SystemExit) as info:
        main(["--ranks", ranks])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--ranks" in err and "Traceback" not in err


def test_unknown_profile_from_the_environment(monkeypatch):
    from colo_fsm.testing.profiles import PROFILE_ENV, lifecycle_settings

    monkeypatch.setenv(PROFILE_ENV, "colo-fsm-huge")
    with pytest.raises(ConfigError, match="colo-fsm-huge"):
        lifecycle_settings()
