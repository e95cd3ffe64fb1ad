"""Timeline pictures from real traces: a real Lifecycle driven over recording fakes, one trace file per rank."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import pytest

from colo_fsm.errors import ActionFailed, ConfigError
from colo_fsm.guards.barrier import SoloBarrier, ThreadBarrier
from colo_fsm.guards.decision import CheckpointDecision, ValidationDecision
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.testing.fakes import recording_adapters
from colo_fsm.timeline import TraceFileError, load_rows, read_trace_file, render_timeline, spans

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_rank(
    path: Path, rank: int, world: int, barrier: object, *, steps: int = 4, fail_on: str | None = None
) -> None:
    _, engine, trainer, collector, drain = recording_adapters()

    def slow_drain() -> object:
        time.sleep(0.002)  # gives every state a visible width
        return drain()

    lc = Lifecycle(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=steps, rank=rank, world_size=world, trace_path=path),
        drain=slow_drain,
        barrier=barrier,  # type: ignore[arg-type]
        checkpoint=CheckpointDecision(2),
        validation=ValidationDecision(3),
        validator=lambda step, version: {"reward": 1.0},
    )
    lc.start()
    try:
        while not lc.finished:
            if fail_on and lc.step_index == 2:
                trainer.fail_on(fail_on)
            time.sleep(0.004)  # collecting while Generating
            trainer.hang_on("train_step", 0.004)
            lc.step([1, 2])
    except ActionFailed:
        pass
    finally:
        lc.stop()


@pytest.fixture(scope="module")
def two_rank_traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("traces")
    shared = threading.Barrier(2)
    paths = [d / f"rank{r}.jsonl" for r in range(2)]
    threads = [
        threading.Thread(target=_run_rank, args=(paths[r], r, 2, ThreadBarrier(shared, r, timeout_s=20)))
        for r in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(p.stat().st_size > 0 for p in paths)
    return paths


@pytest.fixture(scope="module")
def failed_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("failed") / "rank0.jsonl"
    _run_rank(path, 0, 1, SoloBarrier(), steps=6, fail_on="save_checkpoint")
    return path


def _colors_in_png(path: Path) -> set[tuple[int, int, int]]:
    import matplotlib.image as mpimg
    import numpy as np

    img = (mpimg.imread(path)[..., :3] * 255).round().astype(np.uint8)
    return {tuple(int(c) for c in px) for px in np.unique(img.reshape(-1, 3), axis=0)}


def _hex(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_png_of_a_two_rank_run(two_rank_traces: list[Path], tmp_path: Path) -> None:
    from colo_fsm.timeline import _STATE_COLORS

    out = render_timeline(two_rank_traces, tmp_path / "timeline.png")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 15_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 1000 and height >= 200

    # Without the legend, a state's colour can only come from its bars: every state that lasted long enough
    # to be wider than a few pixels must be drawn, and a state that never happened must not be.
    bare = render_timeline(two_rank_traces, tmp_path / "bare.png", legend=False)
    colors = _colors_in_png(bare)
    all_spans = spans(load_rows(two_rank_traces))
    horizon = max(s.end for s in all_spans) - min(s.start for s in all_spans)
    wide = {s.state for s in all_spans if s.end - s.start > horizon / 80}
    assert len(wide) >= 4, wide
    for state in wide:
        assert _hex(_STATE_COLORS[state]) in colors, f"{state} is not drawn"
    assert _hex(_STATE_COLORS["Failed"]) not in colors


def test_rows_and_spans_follow_the_trace(two_rank_traces: list[Path]) -> None:
    rows = load_rows(two_rank_traces)
    assert list(rows) == ["rank 0", "rank 1"]
    for label, recs in rows.items():
        row = [s for s in spans(rows) if s.row == label]
        assert [s.state for s in row[1:]] == [r.dest for r in recs]
        assert row[0].state == "Created" and row[-1].state == "Stopped"
        for a, b in itertools.pairwise(row[1:]):
            assert a.end == pytest.approx(b.start)  # contiguous, no gap, no overlap
        assert all(s.start <= s.action_end <= s.end for s in row)


def test_failed_run_is_drawn(failed_trace: Path, tmp_path: Path) -> None:
    recs = read_trace_file(failed_trace)
    assert any(r.dest == "Failed" for r in recs) and any(not r.ok for r in recs)
    row = spans(load_rows([failed_trace]))
    failed = [s for s in row if s.state == "Failed"]
    assert failed and "save_checkpoint" in (failed[0].error or "")
    out = render_timeline([failed_trace], tmp_path / "failed.svg", title="failure")
    svg = out.read_text()
    assert svg.startswith("<?xml") and "<svg" in svg
    png = render_timeline([failed_trace], tmp_path / "failed.png", legend=False)
    assert (0xB7, 0x1C, 0x1C) in _colors_in_png(png)  # the failure mark


def test_same_rank_in_two_files_gets_two_rows(failed_trace: Path, two_rank_traces: list[Path]) -> None:
    rows = load_rows([failed_trace, two_rank_traces[0]])
    assert len(rows) == 2 and all("rank 0" in k for k in rows)
    assert len(set(rows)) == 2


@pytest.mark.parametrize(
    ("content", "line", "problem"),
    [
        ('{"rank": 0\n', 1, "not JSON"),
        ("[1, 2]\n", 1, "expected a JSON object"),
        ("\n" + json.dumps({"rank": 0, "source": "A", "dest": "B", "trigger": "t", "t_start": 1, "t_enter": 1}), 2,
         "lacks 't_end'"),
        (json.dumps({"rank": "0", "source": "A", "dest": "B", "trigger": "t", "t_start": 1, "t_enter": 1,
                     "t_end": 2}), 1, "rank='0': expected a int"),
        (json.dumps({"rank": 0, "source": "A", "dest": "B", "trigger": "t", "t_start": 3, "t_enter": 1,
                     "t_end": 2}), 1, "out of order"),
    ],
)  # fmt: skip
def test_bad_lines_name_file_and_line(tmp_path: Path, content: str, line: int, problem: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(TraceFileError) as err:
        render_timeline([p], tmp_path / "x.png")
    assert str(err.value).startswith(f"{p}:{line}: ") and problem in str(err.value)
    assert err.value.line == line and not (tmp_path / "x.png").exists()


def test_missing_empty_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceFileError, match="no such trace file") as err:
        read_trace_file(tmp_path / "nope.jsonl")
    assert str(tmp_path / "nope.jsonl") in str(err.value)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TraceFileError, match="no trace records"):
        read_trace_file(tmp_path / "empty.jsonl")
    with pytest.raises(TraceFileError, match="directory"):
        read_trace_file(tmp_path)
    with pytest.raises(ConfigError, match="at least one"):
        load_rows([])


def test_output_format_checked(two_rank_traces: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="output"):
        render_timeline(two_rank_traces, tmp_path / "x.gif")
