"""The map of where parking pays: one row per measured point (output-length cut, ``max_age``, engine loop, model),
with park's samples/s over each other mode's as the runs at that point give them in one process.

The performance page (``bench/gpu_report.py``) opens its headline with this table, and the README quotes it
verbatim (a test keeps the two equal). A ratio enters only as its JSON gives it, and only where both of its modes
pass the bench's own rule (:func:`bench._handoff.ratio_refusal`: 3 or more measured steps, in steady state, some
samples made): the map computes nothing across processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bench._handoff import mode_of_ratio, ratio_refusal
from bench.gpu_runs import label, mode_variant, variant

OTHERS = ("drain", "sync", "abort", "drain-hold")  # the modes park is measured against, in the map's column order

Point = tuple[int, int, str, str]  # (cut, max_age, engine loop, model): the map's order


def standing_ratios(d: dict[str, Any]) -> dict[str, float]:
    """Park over each other mode in one run's JSON (``{"drain": 1.31, ...}``), only the ratios whose two modes
    each pass the bench's rule (an older JSON's ratio between shorter or filling windows is left out)."""
    out: dict[str, float] = {}
    modes = d.get("modes") or {}
    for key, value in d.items():
        if not key.startswith("ratio_park_over_") or key.endswith(("_cpu", "_per_round")):
            continue
        if not isinstance(value, float):
            continue
        other = mode_of_ratio(key)
        if ratio_refusal("park", modes.get("park")) is None and ratio_refusal(other, modes.get(other)) is None:
            out[other] = value
    return out


class MapRatio(NamedTuple):
    """One process's park / other mode at a point, and how that run's other mode differs from its other runs
    (:func:`bench.gpu_runs.mode_variant`): ``forced`` for a drain whose race was forced collector-first, ``aligned``
    for a sync drawn from where park's measured steps start (the runs before that rule drew sync from the stream's
    first prompt), else ``""``."""

    value: float
    variant: str = ""

    def __str__(self) -> str:
        return label(f"{self.value:.3f}", self.variant)


@dataclass
class MapRow:
    """One measured point: every standing ratio of its runs, the modes run there (``measured``: with a rate, whole
    or not; ``standing``: with a figure a ratio could take), park's rate per run."""

    point: Point
    ratios: dict[str, list[MapRatio]] = field(default_factory=dict)
    measured: set[str] = field(default_factory=set)
    standing: set[str] = field(default_factory=set)
    park: list[float] = field(default_factory=list)

    def values(self, other: str) -> list[float]:
        """The ratios against ``other`` as numbers, oldest run first (empty where none stands)."""
        return [r.value for r in self.ratios.get(other, [])]

    def cell(self, other: str) -> str:
        """The ratios against ``other``, oldest run first (``(forced)`` after one whose drain ran with
        ``--drain-race collector-first``); ``no ratio`` where it gave a figure but never beside a park that gives
        one; ``no figure`` where it ran but never gave one a ratio could take (:func:`~bench._handoff.ratio_refusal`);
        ``-`` where it did not run."""
        if self.ratios.get(other):
            return ", ".join(str(r) for r in self.ratios[other])
        if other in self.standing:
            return "no ratio"
        return "no figure" if other in self.measured else "-"


def point_of(d: dict[str, Any]) -> Point:
    """Where one run sits on the map."""
    shape = d["shape"]
    return (
        int(shape["max_tokens"]),
        int(shape["max_trajectory_age_steps"]),
        str(d.get("engine", "direct")),
        variant(str(d["model"]), d),  # a run on non-default CUDA graphs (or pause checks) is a point of its own
    )


def map_rows(runs: list[dict[str, Any]]) -> list[MapRow]:
    """The map of ``runs`` (the headline's, oldest first), one row per point, by cut, age, loop and model."""
    rows: dict[Point, MapRow] = {}
    for d in runs:
        point = point_of(d)
        row = rows.setdefault(point, MapRow(point))
        modes = d.get("modes") or {}
        ran = {m for m, r in modes.items() if "samples_per_s" in (r or {})}
        row.measured |= ran
        row.standing |= {m for m in ran if ratio_refusal(m, modes[m]) is None}
        for other, value in standing_ratios(d).items():
            row.ratios.setdefault(other, []).append(MapRatio(value, mode_variant(d, other)))
        park = modes.get("park")
        if ratio_refusal("park", park) is None:
            assert park is not None
            row.park.append(float(park["samples_per_s"]))
    return [rows[p] for p in sorted(rows)]


def map_table(runs: list[dict[str, Any]]) -> list[str]:
    """The map as Markdown table lines (a column per mode park was measured against at any point)."""
    rows = map_rows(runs)
    others = [m for m in OTHERS if any(m in r.measured for r in rows)]
    lines = [
        "| cut | max_age | engine loop | model | "
        + " | ".join(f"park / {m}" for m in others)
        + " | park samples/s, each run |",
        "|---|---|---|---|" + "---|" * len(others) + "---|",
    ]
    for r in rows:
        cut, age, engine, model = r.point
        cells = [f"{cut:,}", str(age), engine, model, *(r.cell(m) for m in others)]
        cells.append(", ".join(f"{x:.2f}" for x in r.park) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


INTRO = (
    "Park's samples/s over each other mode's, one figure per process that measured both, each mode at 3 or more "
    "measured steps in steady state. Above 1, parking paid at that point; `-`: the mode did not run there; "
    "`no ratio`: it gave figures only in processes without a park that gives one (its figures are in the point's "
    "section below); `no figure`: it ran, but never with a figure a ratio could take (fewer than 3 measured steps, "
    "no sample made or no steady window: the point's section below says which); `(forced)`: a drain whose race "
    "with the trainer was forced collector-first (`--drain-race collector-first`: every handoff waited for the "
    "groups admitted after the step before), where the others let either thread go first; `(aligned)`: a sync that "
    "drew its prompts from where park's measured steps start, so both trained the same prompts, where the others "
    "drew sync from the stream's first prompt."
)


def map_section(runs: list[dict[str, Any]], picture: str | None = None) -> list[str]:
    """The page's section: a heading, what a cell means, the table, and the map's picture if one was drawn."""
    lines = ["### Where parking pays: the map", "", INTRO, "", *map_table(runs), ""]
    return lines + ([f"![where parking pays: the map]({picture})", ""] if picture else [])


# The targets park is measured against on the reasoning workload's own point (gpt200m, max_age 2): (cut, mode) ->
# park's samples/s over that mode's. The map's picture marks them; the page's notes say which are met.
TARGETS: dict[tuple[int, str], float] = {
    (8192, "drain"): 1.5,
    (8192, "sync"): 2.0,
    (8192, "abort"): 1.15,
    (32768, "drain"): 2.0,
    (32768, "sync"): 2.5,
}


__all__ = [
    "INTRO",
    "TARGETS",
    "MapRatio",
    "MapRow",
    "map_rows",
    "map_section",
    "map_table",
    "point_of",
    "standing_ratios",
]
