"""The spread of a benchmark's figures over several runs: median, quartiles and range of every number its JSON
holds, and the figures a script names as its headline.

``bench/run_all.py --repeat N`` runs a script N times, keeps each run's JSON and hands them here. A figure is
named by its path in the JSON: keys and list indexes joined by dots (``results.plain.ratio_to_transitions``,
``rows.0.ratio_fingerprint_vs_plain``), optionally prefixed by the file (``fingerprint_barrier.json:rows.0...``)
when a run writes several. A script declares its headline as a module-level ``HEADLINE = {"label": "path", ...}``
literal (read from its source, never imported).
"""

from __future__ import annotations

import ast
import json
import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def leaves(data: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every finite number in ``data`` (not a bool) with its dotted path."""
    if isinstance(data, Mapping):
        for k, v in data.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(data, list | tuple):
        for i, v in enumerate(data):
            yield from leaves(v, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(data, int | float) and not isinstance(data, bool) and math.isfinite(data):
        yield prefix, float(data)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles (inclusive: with 2 or 3 runs they lie between the values), min, max and the values."""
    xs = sorted(values)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else [xs[0]] * 3
    return {
        "median": statistics.median(xs),
        "p25": q[0],
        "p75": q[2],
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
        "values": list(values),
    }


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per JSON file name, per figure path present in every run that wrote the file: its :func:`spread`."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    names = sorted({name for run in runs for name in run})
    for name in names:
        found = [dict(leaves(run[name])) for run in runs if name in run]
        common = [p for p in found[0] if all(p in f for f in found[1:])]
        out[name] = {p: spread([f[p] for f in found]) for p in common}
    return out


def lookup(summary: Mapping[str, Mapping[str, dict[str, Any]]], path: str) -> dict[str, Any] | None:
    """The spread of one figure: ``file.json:dotted.path`` or just ``dotted.path`` (the first file that has it)."""
    if ":" in path:
        name, inner = path.split(":", 1)
        return summary.get(name, {}).get(inner)
    for figures in summary.values():
        if path in figures:
            return figures[path]
    return None


def declared_headline(script: Path) -> dict[str, str]:
    """The script's module-level ``HEADLINE`` dict literal (label -> figure path), empty when it declares none."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, expr = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, expr = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "HEADLINE":
            value = ast.literal_eval(expr)
            if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                return value
    return {}


def read_runs(folders: Sequence[Path]) -> list[dict[str, Any]]:
    """Each run folder's JSON files, by file name."""
    runs = []
    for folder in folders:
        run = {}
        for f in sorted(folder.glob("*.json")):
            try:
                run[f.name] = json.loads(f.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
        runs.append(run)
    return runs


def fmt(x: float) -> str:
    """A figure with three significant digits (no exponent for the sizes benchmarks print)."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def headline_rows(
    script: str, figures: Mapping[str, str], summary: Mapping[str, Mapping[str, dict[str, Any]]]
) -> list[tuple[str, str, str, str, str, str]]:
    """Table rows (script, figure, median, quartiles, range, runs) for each named figure; one that no run wrote is
    listed as missing."""
    rows = []
    for label, path in figures.items():
        s = lookup(summary, path)
        if s is None:
            rows.append((script, label, "missing", "-", "-", "0"))
            continue
        rows.append(
            (
                script,
                label,
                fmt(s["median"]),
                f"{fmt(s['p25'])}-{fmt(s['p75'])}",
                f"{fmt(s['min'])}-{fmt(s['max'])}",
                str(s["n"]),
            )
        )
    return rows


__all__ = ["declared_headline", "fmt", "headline_rows", "leaves", "lookup", "read_runs", "spread", "summarize"]
