"""The performance page's two pictures: the headline's bars (each mode's samples/s per workload) and the map of
where parking pays (park's one-process ratios per measured point, beside the targets). ``bench/gpu_report.py``
draws both when asked for ``--plot``. The numbers are the committed runs' (``bench/gpu_runs.py``) and the map's
rows (``bench/parking_map.py``); the bars add only medians and ranges of those numbers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from bench._handoff import MIN_STEPS
from bench.gpu_runs import Key, by_variant, in_median, label, mode_figures
from bench.parking_map import OTHERS, TARGETS, MapRow, Point, map_rows, standing_ratios

COLORS = {"park": "#2a7ab9", "drain": "#d9822b", "sync": "#8c8c8c", "abort": "#b93a3a", "drain-hold": "#e0b04a"}


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (no display on the GPU machine or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bars(runs: dict[Key, list[dict[str, Any]]], path: Path, title: str = "") -> None:
    """Bars: each mode's samples/s (median of its runs with enough steps) per workload; whiskers: the range over
    single steps; dots: each run's figure (hollow: a run not in the median: fewer steps, a filling buffer or no
    sample made)."""
    plt = _pyplot()
    keys = sorted(runs)
    fig, axes = plt.subplots(1, len(keys), figsize=(6.4 * len(keys), 4.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        xs: list[int] = []
        labels: list[str] = []
        for (mode, variant), rows in by_variant(runs[key]).items():
            x = len(xs)
            f = mode_figures(rows)
            if f.median is not None:
                med = f.median
                lo = med if f.low is None else min(med, f.low)
                hi = med if f.high is None else max(med, f.high)
                ax.bar(
                    x,
                    med,
                    0.6,
                    color=COLORS[mode],
                    alpha=0.85,
                    yerr=[[med - lo], [hi - med]],
                    capsize=5,
                )
                ax.text(x, hi, f"{med:.2f}\n{f.runs} run(s), {f.steps} steps", ha="center", va="bottom", fontsize=8)
            for d, r in rows:
                full = in_median(d, r)
                ax.plot(
                    x + 0.18,
                    r["samples_per_s"],
                    "o",
                    color="black" if full else "none",
                    markeredgecolor="black",
                    markersize=4,
                )
                if r.get("trained_samples_per_s") is not None:
                    ax.plot(x - 0.18, r["trained_samples_per_s"], "x", color="black", markersize=5)
            xs.append(x)
            labels.append(label(mode, variant))
        ax.set_xticks(xs, labels)
        model, cut, age = key
        ratios = [f"park/{m} {v:.3f}" for d in runs[key] for m, v in standing_ratios(d).items()]
        ax.set_title(f"{model}, cut {cut:,}, max_age {age}\n{', '.join(ratios)}", fontsize=9)
        ax.set_ylabel("samples / s made in the measured window")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    fig.suptitle(title or "Where parking pays", fontsize=10)
    fig.text(
        0.5,
        0.01,
        f"bar: median of runs with >= {MIN_STEPS} measured steps in steady state; whisker: single steps\n"
        "dot: each run (hollow: fewer steps, a filling buffer or no sample made); x: each run's trained samples/s\n"
        "ratios: each from the one run that measured both modes",
        ha="center",
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def point_label(point: Point) -> str:
    """A row's name on the picture: ``cut 8,192, max_age 2, coordinator, gpt200m``."""
    cut, age, engine, model = point
    return f"cut {cut:,}, max_age {age}, {engine}, {model}"


NO_RATIO_YET = "no one-process ratio yet (see the map's table)"


def draw_map(ax: Any, rows: list[MapRow]) -> None:
    """The map's rows (:func:`~bench.parking_map.map_rows`) on ``ax``: a row per point, a dot per one-process ratio
    (a colour per mode park was measured against), the line at 1 (parking pays to its right) and, on the workload's
    own point, each target as a bar; a point with no one-process ratio says so (:data:`NO_RATIO_YET`)."""
    rows = rows[::-1]  # the first point at the top
    others = [m for m in OTHERS if any(r.ratios.get(m) for r in rows)]
    for y, row in enumerate(rows):
        cut, age, _, model = row.point
        for i, m in enumerate(others):
            dy = (i - (len(others) - 1) / 2) * 0.16
            xs = row.values(m)
            ax.plot(xs, [y + dy] * len(xs), "o", color=COLORS[m], markersize=6, label=f"park / {m}")
            target = TARGETS.get((cut, m)) if (model, age) == ("gpt200m", 2) else None
            if target is not None:
                ax.plot([target], [y + dy], "|", color=COLORS[m], markersize=14, markeredgewidth=2.5)
        if not any(row.ratios.values()):  # no process here measured park and another mode, both with a figure
            ax.text(1.01, y, NO_RATIO_YET, fontsize=8, va="center", color="0.35")
    marks = [x for r in rows for m in r.ratios for x in r.values(m)] + list(TARGETS.values())
    ax.set_xlim(min(0.95, min(marks) - 0.05), max(marks) + 0.15)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.text(1.01, len(rows) - 0.45, "parking pays to the right", fontsize=8, va="top")
    ax.set_yticks(range(len(rows)), [point_label(r.point) for r in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("park's samples/s over the other mode's, one process (dot: a run; bar: the target)")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3)


def plot_map(runs: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """The map as a picture (:func:`draw_map`), written to ``path``."""
    plt = _pyplot()
    rows = map_rows(runs)
    fig, ax = plt.subplots(figsize=(10.0, 1.4 + 0.55 * len(rows)))
    draw_map(ax, rows)
    ax.set_title(textwrap.fill(title or "Where parking pays: the map", 80), fontsize=10)  # the axes' width
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["COLORS", "NO_RATIO_YET", "draw_map", "plot_bars", "plot_map", "point_label"]
