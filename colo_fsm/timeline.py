"""Render transition traces as a timeline: lifecycle states against wall-clock time, one row per rank.

A trace is the JSON-lines file a :class:`~colo_fsm.machine.trace.Trace` writes (one record per transition).
Give one file per rank, or one file holding several ranks; the picture has one row per rank, each state a
coloured span, the time an action ran drawn as a dark strip under its span, and failures marked.

The machine is in ``dest`` from a record's ``t_enter`` until the next record's ``t_enter`` (the next trigger
is evaluated in the old state); the last state of a row extends to the end of the last record of any row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger
from colo_fsm.machine.trace import TraceFileError, TraceRecord, read_trace_file
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec

log = get_logger(__name__)

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


def _colors(states: Iterable[str], spec: LifecycleSpec) -> dict[str, str]:
    order = [s.state.value for s in spec.states]
    seen = list(dict.fromkeys([*order, *sorted(set(states) - set(order))]))
    colors: dict[str, str] = {}
    extra = iter(_EXTRA_COLORS * 4)
    for name in seen:
        colors[name] = _STATE_COLORS.get(name) or next(extra, "#9e9e9e")
    return colors


_MIN_WIDTH_MAX_SPANS = 300
"""Rows with more spans than this are drawn at true width (no minimum width for short states)."""


def render_timeline(
    traces: Sequence[str | Path],
    output: str | Path,
    *,
    title: str | None = None,
    spec: LifecycleSpec = LIFECYCLE,
    width_in: float = 12.0,
    dpi: int = 120,
    legend: bool = True,
) -> Path:
    """Draw the traces at ``traces`` (JSON-lines files) to ``output`` (.png, .svg or .pdf); return the path.

    X axis: seconds of wall-clock time since the earliest record; one row per rank; one colour per state
    (legend lists the states present, in lifecycle order); failed transitions and Failed are marked.
    """
    out = Path(output)
    kind = out.suffix.lstrip(".").lower()
    if kind not in TIMELINE_FORMATS:
        raise ConfigError(
            "output", str(output), f"a file ending in one of {', '.join('.' + f for f in TIMELINE_FORMATS)}"
        )
    if not isinstance(dpi, int) or dpi < 10:
        raise ConfigError("dpi", dpi, "an integer >= 10")
    rows = load_rows(traces)
    all_spans = spans(rows)

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = min(s.start for s in all_spans)
    t1 = max(s.end for s in all_spans)
    horizon = max(t1 - t0, 1e-6)
    present = list(dict.fromkeys(s.state for s in all_spans))
    colors = _colors(present, spec)
    labels = list(rows)
    fig_h = 1.6 + 0.55 * len(labels)
    fig, ax = plt.subplots(figsize=(width_in, fig_h), dpi=dpi)
    try:
        for y, label in enumerate(labels):
            row = [s for s in all_spans if s.row == label]
            # Keep instantaneous states visible in short runs; in long runs (hundreds of steps) a minimum width
            # would paint sub-millisecond states (Waking) over most of the row and misstate where time goes.
            min_w = horizon / 2000.0 if len(row) <= _MIN_WIDTH_MAX_SPANS else 0.0
            by_state: dict[str, list[tuple[float, float]]] = {}
            strips: list[tuple[float, float]] = []
            for s in row:
                by_state.setdefault(s.state, []).append((s.start - t0, max(s.end - s.start, min_w)))
                if s.action_end > s.start:
                    strips.append((s.start - t0, max(s.action_end - s.start, min_w)))
            for state, bars in by_state.items():
                ax.broken_barh(bars, (y - 0.36, 0.72), facecolors=colors[state], edgecolors="none")
            if strips:
                ax.broken_barh(strips, (y - 0.36, 0.12), facecolors="#212121", edgecolors="none", alpha=0.55)
            for s in row:
                if s.state != spec.failed.value:
                    continue
                # one mark per failure, where the machine entered Failed, with the recorded cause above the bar
                ax.plot([s.start - t0], [y], marker="X", markersize=11, color="#b71c1c", markeredgecolor="white",
                        zorder=5)  # fmt: skip
                if s.error:
                    text = s.error if len(s.error) <= 90 else s.error[:87] + "..."
                    left = s.start - t0 < horizon / 2
                    ax.annotate(text, (s.start - t0, y - 0.38), fontsize=7, color="#b71c1c", va="bottom",
                                ha="left" if left else "right", zorder=6)  # fmt: skip
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(len(labels) - 0.4, -0.8)
        ax.set_xlim(0, horizon * 1.01)
        ax.set_xlabel("wall-clock time since the first transition (s)")
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_title(
            title
            or f"colo-fsm timeline ({len(labels)} row{'s' if len(labels) != 1 else ''}, "
            f"{sum(len(r) for r in rows.values())} transitions)"
        )
        handles = [] if not legend else [Patch(facecolor=colors[s], label=s) for s in colors if s in present]
        if handles:
            handles.append(Patch(facecolor="#212121", alpha=0.55, label="actions running"))
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=kind)
    finally:
        plt.close(fig)
    log.info("timeline of %d row(s) written to %s", len(labels), out)
    return out


__all__ = ["TIMELINE_FORMATS", "Span", "TraceFileError", "load_rows", "read_trace_file", "render_timeline", "spans"]
