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
from colo_fsm.timeline import (
    TraceFileError,
    clip,
    load_rows,
    parse_range,
    read_trace_file,
    render_timeline,
    spans,
    step_marks,
    window,
)

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
    for p in paths:  # the real run's order, on a clock of our own: a busy machine must not decide what is wide
        _retime(p)
    return paths


def _retime(path: Path, tick_s: float = 0.01) -> None:
    """Rewrite ``path``'s records in place, keeping their order, with transition i fired at ``i * tick_s``."""
    import dataclasses

    from colo_fsm.machine.trace import Trace

    records = read_trace_file(path)
    path.unlink()
    trace = Trace(path, keep=False)
    for i, r in enumerate(records):
        t = 1_000.0 + i * tick_s
        trace.append(dataclasses.replace(r, t_start=t, t_enter=t + tick_s / 10, t_end=t + tick_s / 5))
    trace.close()


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


# ---------------------------------------------------------------------------------------------- windows, labels
def test_step_marks_follow_the_trace(two_rank_traces: list[Path]) -> None:
    rows = load_rows(two_rank_traces)
    marks = step_marks(rows)
    for label, recs in rows.items():
        mine = [m for m in marks if m.row == label]
        assert [m.step for m in mine] == [1, 2, 3, 4]
        assert [m.version for m in mine] == [1, 2, 3, 4]  # the version each step trains to
        begins = [r.t_start for r in recs if r.trigger == "begin_step"]
        assert [m.t_begin for m in mine] == begins
        assert all(m.t_bump is not None and m.t_begin < m.t_bump for m in mine)


def test_step_window_holds_exactly_those_steps(two_rank_traces: list[Path]) -> None:
    rows = load_rows(two_rank_traces)
    lo, hi = window(rows, steps=(2, 3))
    for label, recs in rows.items():
        trained = [r.step for r in recs if r.trigger == "train" and lo <= r.t_enter <= hi]
        assert trained == [2, 3], label
        begun = [r.step + 1 for r in recs if r.trigger == "begin_step" and lo <= r.t_start < hi]
        # a step runs until the next one begins on every row: a rank that begins step 4 first shows that start
        assert begun[:2] == [2, 3] and begun[2:] in ([], [4]), label
    shown = clip(spans(rows), lo, hi)
    assert shown and all(lo <= s.start <= s.end <= hi for s in shown)
    assert min(s.start for s in shown) == lo and max(s.end for s in shown) == hi
    # one step, an open end and an open start
    one = window(rows, steps=(4, 4))
    assert one[1] == max(s.end for s in spans(rows))  # the last step runs to the end of the trace
    assert window(rows, steps=(3, None))[0] == window(rows, steps=(3, 4))[0]
    assert window(rows, steps=(None, 1))[0] == min(s.start for s in spans(rows))


def test_time_window_and_both(two_rank_traces: list[Path]) -> None:
    rows = load_rows(two_rank_traces)
    every = spans(rows)
    t0, t1 = min(s.start for s in every), max(s.end for s in every)
    mid = (t1 - t0) / 2
    lo, hi = window(rows, time_range=(mid, None))
    assert lo == pytest.approx(t0 + mid) and hi == t1
    shown = clip(every, lo, hi)
    assert all(s.start >= lo for s in shown) and len(shown) < len(every)
    s_lo, s_hi = window(rows, steps=(1, 2))
    both = window(rows, steps=(1, 2), time_range=(0, mid))
    assert both == (max(s_lo, t0), min(s_hi, t0 + mid))


@pytest.mark.parametrize(
    ("text", "integer", "expected"),
    [("2:3", True, (2, 3)), ("5", True, (5, 5)), ("3:", True, (3, None)), (":4", True, (None, 4)),
     ("0.5:1.25", False, (0.5, 1.25)), (":2", False, (None, 2.0))],
)  # fmt: skip
def test_parse_range(text: str, integer: bool, expected: tuple[float | None, float | None]) -> None:
    assert parse_range(text, "steps" if integer else "time", integer=integer) == expected


@pytest.mark.parametrize(
    ("text", "integer"), [("4:3", True), ("0:2", True), ("a:b", True), ("1.5:2", True), ("1:2:3", True),
                          ("", True), ("2", False), ("-1:2", False), ("nan:1", False), ("3:1", False)]
)  # fmt: skip
def test_parse_range_rejects(text: str, integer: bool) -> None:
    field = "steps" if integer else "time"
    with pytest.raises(ConfigError) as err:
        parse_range(text, field, integer=integer)
    assert err.value.field == field and repr(text) in str(err.value)


def test_window_outside_the_trace_is_refused(two_rank_traces: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"steps='7:9'.*steps 1\.\.4") as err:
        render_timeline(two_rank_traces, tmp_path / "w.png", steps="7:9")
    assert err.value.field == "steps" and not (tmp_path / "w.png").exists()
    with pytest.raises(ConfigError, match="time") as err:
        render_timeline(two_rank_traces, tmp_path / "w.png", time_range="1000:")
    assert err.value.field == "time"


def test_window_picture_shows_only_the_window(two_rank_traces: list[Path], tmp_path: Path) -> None:
    from colo_fsm.timeline import _STATE_COLORS

    rows = load_rows(two_rank_traces)
    lo, hi = window(rows, steps=(2, 2))
    states = {s.state for s in clip(spans(rows), lo, hi)}
    assert "Created" not in states and "Stopped" not in states
    png = render_timeline(two_rank_traces, tmp_path / "step2.png", steps="2", legend=False)
    colors = _colors_in_png(png)
    assert _hex(_STATE_COLORS["Training"]) in colors
    # (Stopped's grey is also a shade of the text's anti-aliasing; Created and Done are not)
    assert _hex(_STATE_COLORS["Created"]) not in colors and _hex(_STATE_COLORS["Done"]) not in colors


def _write_long_trace(path: Path, train_s: float = 20e-6) -> Path:
    """400 steps written as a trace: 100 ms of Generating each, Training ``train_s``, every other handoff state
    20 us (far below a pixel)."""
    from colo_fsm.machine.trace import Trace, TraceRecord

    trace, t, seq = Trace(path, keep=False), 1_000.0, 0

    def rec(trigger: str, source: str, dest: str, step: int, hold: float) -> None:
        nonlocal t, seq
        trace.append(TraceRecord(seq, 0, trigger, source, dest, step, step, t, t, t + hold / 2))
        seq, t = seq + 1, t + hold

    rec("start", "Created", "Starting", 0, 20e-6)
    rec("generate", "Starting", "Generating", 0, 0.1)
    for k in range(1, 401):
        rec("begin_step", "Generating", "Draining", k - 1, 20e-6)
        rec("train", "Draining", "Training", k, train_s)
        if k % 4 == 0:
            rec("conclude", "Training", "Validating", k, 20e-6)
            rec("end_validation", "Validating", "Generating", k, 0.1)
        else:
            rec("conclude", "Training", "Waking", k, 20e-6)
            rec("resume", "Waking", "Generating", k, 0.1)
    rec("stop", "Generating", "Stopped", 400, 20e-6)
    trace.close()
    return path


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 steps, every handoff state 20 us (far below a pixel)."""
    return _write_long_trace(tmp_path_factory.mktemp("long") / "rank0.jsonl")


def test_short_states_stay_visible_in_a_long_run(long_trace: Path, tmp_path: Path) -> None:
    from colo_fsm.timeline import _STATE_COLORS

    rows = load_rows([long_trace])
    every = spans(rows)
    assert len(every) > 300  # a long row: no minimum width, markers instead
    horizon = max(s.end for s in every) - min(s.start for s in every)
    waking = [s for s in every if s.state == "Waking"]
    assert len(waking) == 300 and max(s.end - s.start for s in waking) < horizon / 100_000  # far below a pixel
    colors = _colors_in_png(render_timeline([long_trace], tmp_path / "long.png", legend=False, labels=False, full=True))
    assert _hex(_STATE_COLORS["Waking"]) in colors and _hex(_STATE_COLORS["Validating"]) in colors
    # in a window of a few steps the same states are drawn as (minimum-width) bars
    colors = _colors_in_png(render_timeline([long_trace], tmp_path / "win.png", steps="200:203", legend=False))
    assert _hex(_STATE_COLORS["Waking"]) in colors


def _longest_run(path: Path, color: str) -> int:
    """The widest horizontal stretch of ``color`` pixels anywhere in the picture at ``path``."""
    import matplotlib.image as mpimg
    import numpy as np

    img = (mpimg.imread(path)[..., :3] * 255).round().astype(np.uint8)
    mask = np.all(img == np.array(_hex(color), dtype=np.uint8), axis=-1)
    best = 0
    for row in mask:
        run = 0
        for on in row:
            run = run + 1 if on else 0
            best = max(best, run)
    return best


def test_a_long_run_is_readable_by_default(long_trace: Path, tmp_path: Path) -> None:
    """400 steps: by default the last 20 are drawn (each step's Generating a wide bar, not a barcode line);
    full=True (the CLI's --full) draws all 400."""
    from colo_fsm.timeline import _STATE_COLORS, DEFAULT_LAST_STEPS, default_window

    rows = load_rows([long_trace])
    assert DEFAULT_LAST_STEPS == 20 and default_window(rows, 20) == (381, 400)
    assert default_window(rows, 400) is None  # a run no longer than the window is drawn whole
    # Training takes a third of each step here: at full width each step is a sliver of green and blue
    visible = _write_long_trace(tmp_path / "visible.jsonl", train_s=0.05)
    blue = _STATE_COLORS["Training"]
    default = render_timeline([visible], tmp_path / "default.png", legend=False)
    full = render_timeline([visible], tmp_path / "full.png", legend=False, full=True)
    wide, barcode = _longest_run(default, blue), _longest_run(full, blue)
    assert wide >= 15, f"a step's Training is {wide} px wide by default: still a barcode"
    assert barcode <= 3 and wide >= 5 * barcode, (wide, barcode)
    last = render_timeline([visible], tmp_path / "last.png", legend=False, last_steps=100)
    assert barcode < _longest_run(last, blue) < wide  # last_steps=N: another window
    with pytest.raises(ConfigError, match="full"):
        render_timeline([long_trace], tmp_path / "x.png", full=True, steps="1:3")
    with pytest.raises(ConfigError, match="last_steps"):
        render_timeline([long_trace], tmp_path / "x.png", last_steps=5, steps="1:3")
    with pytest.raises(ConfigError, match="last_steps"):
        render_timeline([long_trace], tmp_path / "x.png", last_steps=0)


def test_cli_timeline_full_and_last(long_trace: Path, tmp_path: Path) -> None:
    from colo_fsm.cli import main

    assert main(["timeline", str(long_trace), "-o", str(tmp_path / "f.png"), "--full"]) == 0
    assert main(["timeline", str(long_trace), "-o", str(tmp_path / "l.png"), "--last", "5"]) == 0
    assert main(["timeline", str(long_trace), "-o", str(tmp_path / "b.png"), "--full", "--steps", "2:3"]) == 2
    assert not (tmp_path / "b.png").exists()


def test_cli_timeline_window(two_rank_traces: list[Path], tmp_path: Path) -> None:
    from colo_fsm.cli import main

    out = tmp_path / "cli.png"
    assert main(["timeline", *map(str, two_rank_traces), "-o", str(out), "--steps", "2:3", "--time", "0:"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert main(["timeline", *map(str, two_rank_traces), "-o", str(tmp_path / "b.png"), "--steps", "3:2"]) == 2
    assert not (tmp_path / "b.png").exists()


def test_step_window_is_cut_row_by_row_for_separate_runs(two_rank_traces: list[Path], long_trace: Path) -> None:
    from colo_fsm.timeline import row_windows

    rows = load_rows([two_rank_traces[0], long_trace])  # two runs, two clocks
    own = row_windows(rows, (2, 3))
    assert set(own) == set(rows)
    for label, (lo, hi) in own.items():
        recs = rows[label]
        begins = [r.t_start for r in recs if r.trigger == "begin_step"]
        assert lo == begins[1] and hi == begins[3]  # its own step 2 .. its own step 4's begin
        trained = [r.step for r in recs if r.trigger == "train" and lo <= r.t_enter <= hi]
        assert trained == [2, 3], label
    # a single run keeps the one window of window()
    one = load_rows(two_rank_traces)
    lo, hi = window(one, steps=(2, 3))
    assert all(lo <= a < b <= hi for a, b in row_windows(one, (2, 3)).values())
