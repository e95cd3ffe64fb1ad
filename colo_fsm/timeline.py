"""Render transition traces as a timeline: lifecycle states against wall-clock time, one row per rank.

A trace is the JSON-lines file a :class:`~colo_fsm.machine.trace.Trace` writes (one record per transition).
Give one file per rank, or one file holding several ranks; the picture has one row per rank, each state a
coloured span, the time an action ran drawn as a dark strip under its span, and failures marked.

The machine is in ``dest`` from a record's ``t_enter`` until the next record's ``t_enter`` (the next trigger
is evaluated in the old state); the last state of a row extends to the end of the last record of any row.

A long run is read step by step through a window: ``steps=(A, B)`` shows training steps A through B (a step
runs from its ``begin_step`` trigger to the next step's, so it holds the handoff, training, any save or
validation, and the generation that feeds the next step), ``time_range=(A, B)`` shows seconds A through B
since the first transition; given both, the picture shows where they overlap. The top axis labels each step
where it begins, and each row marks the weight version where training bumps it. States too short to see at
the picture's scale (Waking, often Validating) are drawn at a minimum width when a row shows few spans and as
markers above the row otherwise, so no state is invisible and none is drawn wider than it was in a long run.

By default a run longer than :data:`DEFAULT_LAST_STEPS` steps is drawn as a window of its last steps (a
400-step run at full width is a barcode), with a note at the bottom saying so; ``full=True`` (the CLI's
``--full``) draws the whole run, ``last_steps=N`` (``--last N``) another number of steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger
from colo_fsm.machine.trace import TraceFileError, TraceRecord, read_trace_file
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec

STEP_TRIGGER = "begin_step"
"""The trigger that starts a training step (the handoff to training); a step runs until the next one."""

BUMP_TRIGGER = "train"
"""The trigger whose record carries the weight version a training step produced."""

log = get_logger(__name__)

DEFAULT_LAST_STEPS = 20
"""Steps a long run's timeline shows by default (its last ones); ``full=True`` draws the whole run."""

TIMELINE_FORMATS: tuple[str, ...] = ("png", "svg", "pdf")
"""Picture formats :func:`render_timeline` writes."""

# Fixed colours so a state keeps its colour across pictures; Failed is always red, Stopped grey.
_STATE_COLORS: dict[str, str] = {
    "Created": "#b0bec5",
    "Starting": "#ffcc80",
    "Generating": "#66bb6a",
    "Draining": "#ffa726",
    "Training": "#42a5f5",
    "Checkpointing": "#ab47bc",
    "Validating": "#26c6da",
    "Waking": "#d4e157",
    "Done": "#8d6e63",
    "Stopped": "#616161",
    "Failed": "#e53935",
}
_EXTRA_COLORS = ("#f06292", "#9575cd", "#4db6ac", "#fff176", "#a1887f", "#90a4ae", "#aed581", "#ff8a65")


@dataclass(frozen=True)
class Span:
    """One stretch of time a rank's machine spent in ``state``; ``action_end`` is when its actions finished."""

    row: str
    state: str
    start: float
    end: float
    action_end: float
    failed: bool = False
    error: str | None = None


def load_rows(paths: Sequence[str | Path]) -> dict[str, list[TraceRecord]]:
    """Read every trace and group the records into rows, one per rank (``rank N``), sorted by time.

    When two files hold the same rank (e.g. two runs), their rows are told apart by file name.
    """
    if not paths:
        raise ConfigError("traces", list(paths), "at least one JSON-lines trace file")
    per_file = [(Path(p), read_trace_file(p)) for p in paths]
    owners: dict[int, list[Path]] = {}
    for p, recs in per_file:
        for rank in dict.fromkeys(r.rank for r in recs):
            owners.setdefault(rank, []).append(p)
    rows: dict[str, list[TraceRecord]] = {}
    for i, (p, recs) in enumerate(per_file):
        for r in recs:
            files = owners[r.rank]
            if len(files) == 1:
                label = f"rank {r.rank}"
            else:
                label = f"{_short_name(p, files)} rank {r.rank}"
                if sum(1 for f in files if f == p) > 1:  # the same file given twice
                    label = f"#{i + 1} {label}"
            rows.setdefault(label, []).append(r)
    for recs in rows.values():
        recs.sort(key=lambda r: (r.t_start, r.seq))

    def order(item: tuple[str, list[TraceRecord]]) -> tuple[int, str]:
        return (item[1][0].rank, item[0])

    return dict(sorted(rows.items(), key=order))


def _short_name(path: Path, among: Sequence[Path]) -> str:
    """The shortest trailing part of ``path`` that tells it apart from the other paths in ``among``."""
    others = [o for o in among if o != path]
    parts = path.parts
    for n in range(1, len(parts) + 1):
        tail = parts[-n:]
        if all(o.parts[-n:] != tail for o in others):
            return str(Path(*tail))
    return str(path)


def spans(rows: dict[str, list[TraceRecord]]) -> list[Span]:
    """The state spans of every row (see the module docstring for how times map to spans)."""
    if not rows:
        return []
    t_last = max(r.t_end for recs in rows.values() for r in recs)
    out: list[Span] = []
    for label, recs in rows.items():
        first = recs[0]
        if first.t_enter > first.t_start:
            out.append(Span(label, first.source, first.t_start, first.t_enter, first.t_start))
        for i, r in enumerate(recs):
            end = recs[i + 1].t_enter if i + 1 < len(recs) else max(t_last, r.t_end)
            out.append(Span(label, r.dest, r.t_enter, max(end, r.t_end), r.t_end, failed=not r.ok, error=r.error))
    return out


@dataclass(frozen=True)
class StepMark:
    """Where training step ``step`` (1-based) begins on ``row``, and the weight version it trains to.

    ``version`` is the weight version after the step's training and ``t_bump`` when training began (both
    None when the trace ends before it).
    """

    row: str
    step: int
    t_begin: float
    version: int | None
    t_bump: float | None = None


def step_marks(rows: dict[str, list[TraceRecord]]) -> list[StepMark]:
    """Every training step of every row, in time order per row (a step begins at its ``begin_step`` record)."""
    out: list[StepMark] = []
    for label, recs in rows.items():
        pending: list[tuple[int, float]] = []
        for r in recs:
            if r.trigger == STEP_TRIGGER and r.ok:
                pending.append((r.step + 1, r.t_start))
            elif r.trigger == BUMP_TRIGGER and r.ok and pending:
                step, t = pending.pop()
                out.append(StepMark(label, step, t, r.weight_version, r.t_enter))
        out.extend(StepMark(label, step, t, None) for step, t in pending)
    return sorted(out, key=lambda m: (list(rows).index(m.row), m.t_begin))


def parse_range(text: str, field: str, *, integer: bool) -> tuple[float | None, float | None]:
    """Parse ``A:B``, ``A:``, ``:B`` (or a single ``A`` for steps, meaning ``A:A``) into bounds; None is open.

    Raises :class:`~colo_fsm.errors.ConfigError` naming ``field`` for anything else, or for ``A > B``.
    """
    expected = (
        "A:B, A: or :B with whole steps >= 1 (or one step A)"
        if integer
        else "A:B, A: or :B in seconds >= 0 since the first transition"
    )
    raw = text.strip()
    if not raw:
        raise ConfigError(field, text, expected)
    if ":" not in raw and integer:
        raw = f"{raw}:{raw}"
    head, sep, tail = raw.partition(":")
    if not sep or ":" in tail:
        raise ConfigError(field, text, expected)
    bounds: list[float | None] = []
    for part in (head.strip(), tail.strip()):
        if not part:
            bounds.append(None)
            continue
        try:
            value: float = int(part) if integer else float(part)
        except ValueError:
            raise ConfigError(field, text, expected) from None
        if value < (1 if integer else 0) or value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(field, text, expected)
        bounds.append(value)
    lo, hi = bounds
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(field, text, f"{expected}; the start must not be after the end")
    return lo, hi


def window(
    rows: dict[str, list[TraceRecord]],
    *,
    steps: tuple[float | None, float | None] | None = None,
    time_range: tuple[float | None, float | None] | None = None,
) -> tuple[float, float]:
    """The absolute ``(start, end)`` times (``time.time()`` seconds) the picture shows.

    ``steps=(A, B)``: from the earliest ``begin_step`` of step A on any row to the latest ``begin_step`` of
    step B + 1 (or the end of the trace); ``time_range=(A, B)``: seconds since the first transition. Open
    bounds (None) extend to the trace's ends. A window that holds no part of the trace raises
    :class:`~colo_fsm.errors.ConfigError` naming the window and what the trace holds.
    """
    all_spans = spans(rows)
    if not all_spans:
        raise ConfigError("traces", list(rows), "at least one trace record")
    t0 = min(s.start for s in all_spans)
    t1 = max(s.end for s in all_spans)
    lo, hi = t0, t1
    if steps is not None:
        marks = step_marks(rows)
        first, last = steps
        if not marks:
            raise ConfigError("steps", _fmt_range(steps), "a trace with training steps (this one has none)")
        known = sorted({m.step for m in marks})
        begins = [m.t_begin for m in marks if first is None or m.step >= first]
        ends = [m.t_begin for m in marks if last is not None and m.step == last + 1]
        in_range = [m for m in marks if (first is None or m.step >= first) and (last is None or m.step <= last)]
        if not in_range:
            raise ConfigError(
                "steps", _fmt_range(steps), f"a range overlapping steps {known[0]}..{known[-1]} of the trace"
            )
        lo = max(lo, min(begins)) if first is not None else lo
        hi = min(hi, max(ends)) if ends else hi
    if time_range is not None:
        a, b = time_range
        lo = max(lo, t0 + a) if a is not None else lo
        hi = min(hi, t0 + b) if b is not None else hi
        if lo >= hi:
            what = f"seconds 0..{t1 - t0:.3f} of the trace" + (" within the steps given" if steps else "")
            raise ConfigError("time", _fmt_range(time_range), f"a range overlapping {what}")
    return lo, hi


def _fmt_range(r: tuple[float | None, float | None]) -> str:
    return ":".join("" if v is None else f"{v:g}" for v in r)


def row_windows(
    rows: dict[str, list[TraceRecord]], steps: tuple[float | None, float | None]
) -> dict[str, tuple[float, float]]:
    """Each row's own ``(start, end)`` of training steps A through B: from its ``begin_step`` of step A to its
    ``begin_step`` of step B + 1 (or the row's end). Rows of separate runs have separate clocks, so a step
    window is cut row by row; a row without step A in its trace is left out."""
    first, last = steps
    every = spans(rows)
    out: dict[str, tuple[float, float]] = {}
    marks = step_marks(rows)
    for label in rows:
        mine = [m for m in marks if m.row == label]
        row_spans = [s for s in every if s.row == label]
        lo = min(s.start for s in row_spans)
        hi = max(s.end for s in row_spans)
        if first is not None:
            begins = [m.t_begin for m in mine if m.step >= first]
            if not begins:
                continue
            lo = min(begins)
        if last is not None:
            ends = [m.t_begin for m in mine if m.step == last + 1]
            hi = min(ends) if ends else hi
        if lo < hi:
            out[label] = (lo, hi)
    return out


def default_window(rows: dict[str, list[TraceRecord]], last_steps: int) -> tuple[int, int] | None:
    """``(first, total)``: the window of the last ``last_steps`` steps every row has (its first step, and the
    steps of the shortest row with steps), or None when no row has more steps than that."""
    counts: dict[str, int] = {}
    for m in step_marks(rows):
        counts[m.row] = max(counts.get(m.row, 0), m.step)
    if not counts:
        return None
    total = min(counts.values())
    if total <= last_steps:
        return None
    return total - last_steps + 1, total


def clip(all_spans: Sequence[Span], lo: float, hi: float) -> list[Span]:
    """The spans that overlap ``[lo, hi]``, cut to it (a span that only touches an edge is left out)."""
    out: list[Span] = []
    for s in all_spans:
        if s.end <= lo or s.start >= hi:
            if not (s.start == s.end and lo <= s.start <= hi):
                continue
        start, end = max(s.start, lo), min(s.end, hi)
        action_end = min(max(s.action_end, start), end)
        out.append(Span(s.row, s.state, start, end, action_end, s.failed, s.error))
    return out


def _colors(states: Iterable[str], spec: LifecycleSpec) -> dict[str, str]:
    order = [s.state.value for s in spec.states]
    seen = list(dict.fromkeys([*order, *sorted(set(states) - set(order))]))
    colors: dict[str, str] = {}
    extra = iter(_EXTRA_COLORS * 4)
    for name in seen:
        colors[name] = _STATE_COLORS.get(name) or next(extra, "#9e9e9e")
    return colors


_MIN_WIDTH_MAX_SPANS = 300
"""Rows showing more spans than this draw short states as markers above the row instead of at a minimum width."""

_MIN_WIDTH_PX = 2.5
"""The narrowest a span is drawn, in pixels of the plot area (shorter spans get a minimum width or a marker)."""

_LABEL_GAP_PX = 30.0
"""Step and version labels closer than this (pixels) to the previous one shown are left out."""


def _thin(xs: Sequence[float], gap: float) -> list[int]:
    """Indices of ``xs`` (ascending) to label so that no two labelled points are closer than ``gap``."""
    keep: list[int] = []
    for i, x in enumerate(xs):
        if not keep or x - xs[keep[-1]] >= gap:
            keep.append(i)
    return keep


def render_timeline(
    traces: Sequence[str | Path],
    output: str | Path,
    *,
    title: str | None = None,
    spec: LifecycleSpec = LIFECYCLE,
    width_in: float = 12.0,
    dpi: int = 120,
    legend: bool = True,
    steps: tuple[float | None, float | None] | str | None = None,
    time_range: tuple[float | None, float | None] | str | None = None,
    labels: bool = True,
    last_steps: int | None = None,
    full: bool = False,
) -> Path:
    """Draw the traces at ``traces`` (JSON-lines files) to ``output`` (.png, .svg or .pdf); return the path.

    X axis: seconds of wall-clock time since the earliest record (also in a window, so pictures of one run
    line up); one row per rank; one colour per state (the legend lists the states present, in lifecycle
    order); failed transitions and Failed are marked. ``steps`` / ``time_range`` (tuples, or ``"A:B"``
    strings as the CLI takes them) pick a window (see :func:`window`); ``labels`` adds the step numbers on
    the top axis and the weight versions ("v12") where training bumps them. Given neither, a run longer than
    ``last_steps`` (default :data:`DEFAULT_LAST_STEPS`) steps shows its last ``last_steps`` steps, and the
    picture says so; ``full=True`` shows the whole run.
    """
    out = Path(output)
    kind = out.suffix.lstrip(".").lower()
    if kind not in TIMELINE_FORMATS:
        raise ConfigError(
            "output", str(output), f"a file ending in one of {', '.join('.' + f for f in TIMELINE_FORMATS)}"
        )
    if not isinstance(dpi, int) or dpi < 10:
        raise ConfigError("dpi", dpi, "an integer >= 10")
    if isinstance(steps, str):
        steps = parse_range(steps, "steps", integer=True)
    if isinstance(time_range, str):
        time_range = parse_range(time_range, "time", integer=False)
    if last_steps is not None and (not isinstance(last_steps, int) or isinstance(last_steps, bool) or last_steps < 1):
        raise ConfigError("last_steps", last_steps, "a whole number of steps >= 1 (or full=True for the whole run)")
    chosen = [n for n, v in (("steps", steps), ("time_range", time_range), ("last_steps", last_steps)) if v is not None]
    if full and chosen:
        raise ConfigError(
            "full", full, f"either full=True (the whole run) or a window, not both (got {', '.join(chosen)})"
        )
    if last_steps is not None and len(chosen) > 1:
        raise ConfigError("last_steps", last_steps, "either last_steps or steps/time_range, not both")
    rows = load_rows(traces)
    note = ""
    auto: tuple[int, int] | None = None
    if not full and steps is None and time_range is None:
        auto = default_window(rows, last_steps or DEFAULT_LAST_STEPS)
        if auto is not None:
            steps = (auto[0], None)
            note = (
                f"showing the last {auto[1] - auto[0] + 1} of {auto[1]} steps; the whole run: "
                "colo-fsm timeline --full (render_timeline(..., full=True))"
            )
    every = spans(rows)
    t0 = min(s.start for s in every)
    lo, hi = window(rows, steps=steps, time_range=time_range)
    if steps is None:
        shown = clip(every, lo, hi)
    else:  # each row its own steps A..B (rows of separate runs have separate clocks)
        own = row_windows(rows, steps)
        shown = [
            s
            for label, (a, b) in own.items()
            for s in clip([s for s in every if s.row == label], max(a, lo), min(b, hi))
        ]
        if shown:
            lo, hi = min(s.start for s in shown), max(s.end for s in shown)
    first, last = steps if steps is not None else (None, None)
    marks = [
        m
        for m in step_marks(rows)
        if lo <= m.t_begin <= hi and (first is None or m.step >= first) and (last is None or m.step <= last + 1)
    ]

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    x0, x1 = lo - t0, hi - t0
    extent = max(x1 - x0, 1e-6)
    present = list(dict.fromkeys(s.state for s in shown))
    colors = _colors(present, spec)
    row_labels = list(rows)
    fig_h = 1.9 + 0.55 * len(row_labels)
    fig, ax = plt.subplots(figsize=(width_in, fig_h), dpi=dpi)
    markers_used = False
    try:
        px_per_s = (width_in * dpi * 0.78) / extent  # the plot area is about 78% of the figure's width
        min_w = _MIN_WIDTH_PX / px_per_s
        for y, label in enumerate(row_labels):
            row = [s for s in shown if s.row == label]
            # Few spans: draw short states at a minimum width. Many (hundreds of steps): a minimum width would
            # paint sub-millisecond states (Waking) over most of the row and misstate where time goes, so the
            # short spans keep their true width and get a marker above the row instead.
            widen = len(row) <= _MIN_WIDTH_MAX_SPANS
            by_state: dict[str, list[tuple[float, float]]] = {}
            widened: dict[str, list[tuple[float, float]]] = {}  # drawn over the others
            strips: list[tuple[float, float]] = []
            ticks: dict[str, list[float]] = {}
            cursor = -float("inf")  # widened spans are laid side by side, so a run of short states stays readable
            for s in row:
                w = s.end - s.start
                x = s.start - t0
                short = w < min_w
                if widen:
                    x = max(x, cursor) if short else x
                    w = max(w, min_w)
                    cursor = x + w
                elif short and s.state != spec.failed.value:
                    ticks.setdefault(s.state, []).append(x)
                (widened if widen and short else by_state).setdefault(s.state, []).append((x, w))
                if s.action_end > s.start:
                    aw = s.action_end - s.start
                    strips.append((x, min(max(aw, min_w), w) if widen else aw))
            for state, bars in [*by_state.items(), *widened.items()]:
                ax.broken_barh(bars, (y - 0.36, 0.72), facecolors=colors[state], edgecolors="none")
            if strips:
                ax.broken_barh(strips, (y - 0.36, 0.12), facecolors="#212121", edgecolors="none", alpha=0.55)
            for state, xs in ticks.items():
                markers_used = True
                ax.plot(xs, [y - 0.45] * len(xs), linestyle="none", marker="v", markersize=4,
                        color=colors[state], markeredgecolor="#424242", markeredgewidth=0.3, zorder=4)  # fmt: skip
            for s in row:
                if s.state != spec.failed.value:
                    continue
                # one mark per failure, where the machine entered Failed, with the recorded cause above the bar
                ax.plot([s.start - t0], [y], marker="X", markersize=11, color="#b71c1c", markeredgecolor="white",
                        zorder=5)  # fmt: skip
                if s.error:
                    text = s.error if len(s.error) <= 90 else s.error[:87] + "..."
                    left = s.start - t0 < x0 + extent / 2
                    ax.annotate(text, (s.start - t0, y - 0.38), fontsize=7, color="#b71c1c", va="bottom",
                                ha="left" if left else "right", zorder=6)  # fmt: skip
            if labels:
                row_marks = [m for m in marks if m.row == label and m.t_bump is not None and lo <= m.t_bump <= hi]
                for i in _thin([m.t_bump for m in row_marks if m.t_bump is not None], _LABEL_GAP_PX / px_per_s):
                    m = row_marks[i]
                    if m.t_bump is not None:
                        ax.annotate(f"v{m.version}", (m.t_bump - t0, y + 0.36), fontsize=6, color="#0d47a1",
                                    va="top", ha="left", zorder=6, annotation_clip=True)  # fmt: skip
        ax.set_yticks(range(len(row_labels)), row_labels)
        ax.set_ylim(len(row_labels) - 0.4, -0.8)
        ax.set_xlim(x0, x0 + extent * 1.01)
        ax.set_xlabel("wall-clock time since the first transition (s)")
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        if labels and marks:
            first_row = [m for m in marks if m.row == row_labels[0]] or marks
            picked = [first_row[i] for i in _thin([m.t_begin for m in first_row], _LABEL_GAP_PX / px_per_s)]
            thinned = len(picked) < len(first_row)
            top = ax.secondary_xaxis("top")
            top.set_xticks([m.t_begin - t0 for m in picked], [str(m.step) for m in picked], fontsize=7)
            top.set_xlabel(
                "training step (tick: where it begins on "
                + row_labels[0]
                + ("; labels thinned to fit" if thinned else "")
                + "); v = weight version after training",
                fontsize=8,
            )
            for m in first_row:
                ax.axvline(m.t_begin - t0, color="#9e9e9e", linewidth=0.4, linestyle=":", zorder=0)
        where = ""
        if note and auto is not None:
            where = f", the last {auto[1] - auto[0] + 1} of {auto[1]} steps"
        elif steps is not None:
            where = f", steps {_fmt_range(steps)}"
        if time_range is not None:
            where += f", {_fmt_range(time_range)} s"
        ax.set_title(
            title
            or f"colo-fsm timeline ({len(row_labels)} row{'s' if len(row_labels) != 1 else ''}, "
            f"{sum(len(r) for r in rows.values())} transitions{where})"
        )
        handles: list[Patch | Line2D] = (
            [] if not legend else [Patch(facecolor=colors[s], label=s) for s in colors if s in present]
        )
        if handles:
            handles.append(Patch(facecolor="#212121", alpha=0.55, label="actions running"))
            if markers_used:
                handles.append(Line2D([], [], linestyle="none", marker="v", color="#757575", label="too short to see"))
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        if note:
            fig.text(0.995, 0.005, note, fontsize=7, color="#616161", ha="right", va="bottom")
        fig.tight_layout(rect=(0, 0.03 if note else 0, 1, 1))
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=kind)
    finally:
        plt.close(fig)
    log.info("timeline of %d row(s) written to %s", len(row_labels), out)
    return out


__all__ = [
    "BUMP_TRIGGER",
    "DEFAULT_LAST_STEPS",
    "STEP_TRIGGER",
    "TIMELINE_FORMATS",
    "Span",
    "StepMark",
    "TraceFileError",
    "clip",
    "default_window",
    "load_rows",
    "parse_range",
    "read_trace_file",
    "render_timeline",
    "row_windows",
    "spans",
    "step_marks",
    "window",
]
