"""Wall-clock metrics: consumed samples against elapsed seconds; resume does not inflate throughput."""

import pytest

from colo_fsm.errors import ConfigError
from colo_fsm.metrics import MetricsLogger, read_metrics


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_consumed_samples_logged_against_elapsed_wall_clock(tmp_path):
    clock = Clock()
    m = MetricsLogger(tmp_path, tensorboard=False, clock=clock)
    clock.now += 2.0
    m.log(0, {"reward": 0.1}, consumed_samples=8)
    clock.now += 6.0  # an uneven async step (stalled on the buffer)
    m.log(1, {"reward": 0.2}, consumed_samples=8)
    m.close()
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["elapsed_s"] for r in recs] == [2.0, 8.0]
    assert [r["train/consumed_samples"] for r in recs] == [8, 16]
    assert recs[1]["train/samples_per_s"] == pytest.approx(2.0)


def test_resume_keeps_the_total_and_the_clock_but_not_the_rate(tmp_path):
    clock = Clock()
    m = MetricsLogger(tmp_path, tensorboard=False, clock=clock, consumed_samples=1000, elapsed_offset_s=120.0)
    clock.now += 4.0
    rec = m.log(5, {}, consumed_samples=8)
    assert rec["train/consumed_samples"] == 1008
    assert rec["elapsed_s"] == pytest.approx(124.0)  # the curve continues, it does not jump back to 0
    assert rec["train/samples_per_s"] == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="elapsed_offset_s"):
        MetricsLogger(tmp_path, tensorboard=False, elapsed_offset_s=-1)


def test_tensorboard_scalars_written(tmp_path):
    m = MetricsLogger(tmp_path)
    m.log(0, {"reward": 0.5}, consumed_samples=4)
    m.close()
    assert any((tmp_path / "tensorboard").iterdir())


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_counts(tmp_path, bad):
    m = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.raises(ConfigError, match="consumed_samples"):
        m.log(0, {}, consumed_samples=bad)
    with pytest.raises(ConfigError, match="consumed_samples"):
        MetricsLogger(tmp_path, tensorboard=False, consumed_samples=bad)


def test_non_finite_metric_is_rejected(tmp_path):
    m = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.raises(ConfigError, match="reward"):
        m.log(0, {"reward": float("nan")})


@pytest.mark.parametrize(("step", "metrics", "field"), [("x", {}, "step"), (-1, {}, "step"), (0, None, "metrics")])
def test_bad_step_or_metrics(tmp_path, step, metrics, field):
    m = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.raises(ConfigError, match=field):
        m.log(step, metrics)
    assert m.consumed_samples == 0 and (tmp_path / "metrics.jsonl").read_text() == ""
