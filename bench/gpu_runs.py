"""The committed GPU runs, read: every handoff run in a folder grouped by workload, the headline split from the
history, and the bench's rules for which of a run's figures count (read by the performance page,
``bench/gpu_report.py``, and its pictures, ``bench/gpu_plots.py``; the handoff model, ``bench/handoff_model.py``,
reads the runs through :func:`load`).

A handoff run is a JSON that ``bench/inflight_handoff.py`` wrote, on either engine path; an engine-path run is
``bench/engine_paths.py``'s (it has a ``compare`` table). CPU runs (the smoke twins) are left out unless asked for.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._handoff import (  # the bench's own rules
    MIN_STEPS,
    buffer_trend,
    ratio_refusal,
    unsteady_growth,
)
from colo_fsm.adapters.megatron.coordinator_config import MEGATRON_CONSENSUS_INTERVAL

RUNS = Path(__file__).resolve().parent.parent / "docs" / "gpu-runs"
"""The folder of committed runs."""

MODES = ("park", "drain", "sync", "abort", "drain-hold")  # a ratio key spells drain-hold drain_hold (ratio_name)

Key = tuple[str, int, int]  # a workload: (model as its heading names it, output-length cut, max_age)

HEADLINE_COMMITS = (
    "6bd92a8",
    "791d078",
    "b1df85d",
    "4366d6d",
    "6f74238",
    "0bdc5f1",
    "8ba94f0",
    "76259d0",
    "9de9ebc",
    "ad762e2",
    "dec9bed",
    "4406c2f",
    "4a18c96",
    "7d7d980",
    "6f6dd0a",
    "c324f9c",
    "70c3315",
    "e07ddf5",
    "cfe14fd",
    "0441af7",
    "0c47749",
    "2990879",
    "ca6c37b",
    "fb85515",
    "b1d9af0",
    "3385c87",
    "3c2b2f0",
    "1fa633b",
    "1c1ac8d",
    "73940c4",
    "aec3187",  # the files of 2b672ff, whose benches are aec3187's: the machine's .git lagged (docs/gpu-runs/README.md)
    "480d331",
)
"""The commits whose runs in ``docs/gpu-runs/`` are the performance page's headline (``--commits headline``): each
measures the same code, or the page's notes say what differs. A GPU session that commits runs adds its commit here."""


def commits_arg(text: str | None) -> tuple[str, ...]:
    """A ``--commits`` value: the comma-separated commits, ``headline`` among them standing for
    :data:`HEADLINE_COMMITS` (none for an empty or absent value), each once, in order."""
    out: list[str] = []
    for c in (c.strip() for c in (text or "").split(",")):
        for commit in HEADLINE_COMMITS if c == "headline" else (c,) if c else ():
            if commit not in out:
                out.append(commit)
    return tuple(out)


def add_reader_options(ap: argparse.ArgumentParser, out: Path) -> None:
    """The options of a command that reads the committed runs: ``--runs`` (the folder), ``--commits`` (default the
    headline's), ``--out`` (its JSON, default ``out``) and ``--smoke`` (the first run only)."""
    ap.add_argument("--runs", type=Path, default=RUNS, help="the folder of committed runs (default docs/gpu-runs)")
    ap.add_argument("--commits", default="headline", help="comma-separated; default: the headline's (HEADLINE_COMMITS)")
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--smoke", action="store_true", help="the first run only")


def commits_read(ap: argparse.ArgumentParser, args: argparse.Namespace) -> set[str]:
    """``--commits`` of :func:`add_reader_options` read: one commit or more, never none."""
    commits = set(commits_arg(args.commits))
    if not commits:
        ap.error(f"--commits {args.commits!r}: one commit or more, or 'headline'")
    return commits


def read_json(path: Path) -> Any:
    """The file's JSON, or None where it cannot be read or parsed (a folder may hold anything)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


Files = list[tuple[Path, Any]]
"""A folder's JSON files read once (:func:`read_folder`): each path with its JSON, None where unreadable."""


def read_folder(folder: Path) -> Files:
    """Every ``*.json`` in ``folder`` (sorted by name) with its JSON (:func:`read_json`), for readers that look at
    the same files more than one way."""
    return [(path, read_json(path)) for path in sorted(folder.glob("*.json"))]


def is_handoff(path: Path, data: Any) -> bool:
    """A run of ``bench/inflight_handoff.py``, on either engine path (by its content, or its file name)."""
    if not isinstance(data, dict) or not isinstance(data.get("modes"), dict) or "shape" not in data:
        return False
    return data.get("benchmark") == "inflight_handoff" or "inflight_handoff" in path.name


def graph_sizing(value: Any) -> str:
    """A run's (``cuda_graph_sizing``) or a graph table's (``graph_decode.graph_sizing``) CUDA-graph sizing as one
    name: ``"default"`` for megatron's own (unset, or "exponential", its default named), else the sizing."""
    return "default" if value in (None, "exponential") else str(value)


def sized(name: str, data: dict[str, Any]) -> str:
    """``name`` (a model as a heading or a map row says it) with the run's CUDA-graph sizing where it is not
    megatron's default: such a run is never pooled with the default's."""
    sizing = graph_sizing(data.get("cuda_graph_sizing"))
    return name if sizing == "default" else f"{name} with {sizing} CUDA graphs"


PAGE_CARD = "NVIDIA H200"
"""The card of the performance page's runs (its title's): a run on another card is a workload of its own."""


def on_page_card(data: dict[str, Any]) -> bool:
    """Whether a run's card (its JSON's ``machine.device``; none recorded: the page's) is the page's
    (:data:`PAGE_CARD`); CPU runs count as the page's (they are never GPU figures). The models' checks read only
    these runs: their tables and the ranges the docs quote are the H200's."""
    card = str((data.get("machine") or {}).get("device") or PAGE_CARD)
    return card == "cpu" or card.startswith(PAGE_CARD)


def variant(name: str, data: dict[str, Any]) -> str:
    """``name`` as :func:`sized` gives it, and for a run on megatron's coordinator loop whose pause consensus was
    taken other than every 20 loop iterations (``ep_consensus_interval``: colo-fsm sets 1 at expert parallelism
    1; runs before it recorded none, and ran megatron's 20) that interval too, and for a run on a card other
    than the page's (:data:`PAGE_CARD`; the JSON's ``machine.device``) that card: such a run is never pooled
    with the others."""
    name = sized(name, data)
    interval = data.get("ep_consensus_interval") or MEGATRON_CONSENSUS_INTERVAL
    if data.get("engine", "direct") == "coordinator" and interval != MEGATRON_CONSENSUS_INTERVAL:
        name = f"{name}, pause checked every {'step' if interval == 1 else f'{interval} steps'}"
    return name if on_page_card(data) else f"{name}, on an {(data.get('machine') or {}).get('device')}"


def workload_model(data: dict[str, Any]) -> str:
    """The model as a workload's heading names it: a run on megatron-core's coordinator loop is its own workload
    (its figures are never pooled with the direct engine's), and so is a run whose CUDA graphs megatron sized
    other than by its default (``cuda_graph_sizing``, e.g. "linear") or whose coordinator loop checked for a pause
    other than every 20 steps (:func:`variant`)."""
    engine = data.get("engine", "direct")
    return variant(str(data["model"]) if engine == "direct" else f"{data['model']} on the {engine} loop", data)


def load(
    folder: Path, *, include_cpu: bool = False, files: Files | None = None
) -> tuple[dict[Key, list[dict[str, Any]]], list[tuple[Path, Any]]]:
    """Handoff runs grouped by workload ``(model, cut, max_age)``, oldest first, and the engine-path runs, from
    ``folder`` (or from ``files``, the folder as :func:`read_folder` read it)."""
    runs: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    paths = []
    for path, data in read_folder(folder) if files is None else files:
        if isinstance(data, dict) and isinstance(data.get("compare"), dict):
            paths.append((path, data))
            continue
        if not is_handoff(path, data):
            continue
        if data.get("machine", {}).get("device", "cpu") == "cpu" and not include_cpu:
            continue
        shape = data["shape"]
        data["_file"] = path.name
        runs[(workload_model(data), int(shape["max_tokens"]), int(shape["max_trajectory_age_steps"]))].append(data)
    for key in runs:
        runs[key].sort(key=lambda d: (str(d.get("date") or ""), d["_file"]))
    return dict(runs), paths


def split_history(
    runs: dict[Key, list[dict[str, Any]]], commits: tuple[str, ...] = ()
) -> tuple[str | None, dict[Key, list[dict[str, Any]]], dict[Key, list[dict[str, Any]]]]:
    """``(commit, headline, history)``: the headline's commit(s), their runs, and every other run. The headline is
    the runs of ``commits`` (commits the caller states run the same measured code), else of the newest run's."""
    every = [d for rs in runs.values() for d in rs]
    if not every:
        return None, {}, {}
    newest = max(every, key=lambda d: (str(d.get("date") or ""), d["_file"]))
    chosen = set(commits) if commits else {newest.get("commit")}
    head: dict[Key, list[dict[str, Any]]] = {}
    hist: dict[Key, list[dict[str, Any]]] = {}
    for key, rs in runs.items():
        for d in rs:
            now = (d is newest and not commits) or (d.get("commit") is not None and d.get("commit") in chosen)
            (head if now else hist).setdefault(key, []).append(d)
    return (", ".join(commits) if commits else newest.get("commit")), head, hist


def min_steps(d: dict[str, Any]) -> int:
    """The fewest measured steps a mode of this run needs for a ratio (its JSON says; older JSON: the bench's)."""
    return int(d.get("min_steps_for_a_ratio") or MIN_STEPS)


def measured(d: dict[str, Any], m: str) -> dict[str, Any] | None:
    """Mode ``m``'s row in run ``d``, or None where the run did not measure it."""
    row = d["modes"].get(m) or {}
    return row if "samples_per_s" in row else None


def _engine_steps(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """The kinds of engine step in one round's step profile that ran at least once."""
    return [v for v in profile.values() if isinstance(v, dict) and "mean_active" in v and v.get("steps")]


def first_profile(row: dict[str, Any]) -> dict[str, Any]:
    """A mode's first round's engine step profile (empty where it has none)."""
    return (row.get("engine_step_profile_per_round") or [{}])[0]


def requests_per_step(profile: dict[str, Any]) -> float | None:
    """Requests running per engine step over every step one round's profile counts (decode-only and those with a
    prefill), as the handoff model counts them (it admits a request straight into decoding, so its steps are all
    of the engine's). None where the profile counts no step."""
    kinds = _engine_steps(profile)
    steps = sum(int(v["steps"]) for v in kinds)
    return sum(v["steps"] * v["mean_active"] for v in kinds) / steps if steps else None


def drawn_from(d: dict[str, Any], mode: str) -> int:
    """The first prompt a run's ``mode`` drew from the seeded stream (the JSON's ``first_prompt``); 0 for the runs
    that record none, which drew every mode from the stream's start."""
    return int((d.get("first_prompt") or {}).get(mode, 0))


def drain_lost_its_race(row: dict[str, Any]) -> bool:
    """Whether one of a drain's measured handoffs found nothing in flight, the trainer having gone first (older runs
    without that record: whether a measured step made nothing)."""
    found = row.get("groups_in_flight_at_handoff")
    return not all(found) if found is not None else row["step_samples_per_s"]["min"] == 0


def mode_variant(d: dict[str, Any], mode: str) -> str:
    """How a run's ``mode`` differs from the other runs of that mode, as the pages label it: ``forced`` for a drain
    whose race with the trainer was forced collector-first (``--drain-race collector-first``), ``aligned`` for a
    sync drawn from where park's measured steps start (:func:`drawn_from` above 0), else ``""``."""
    if mode == "drain" and d.get("drain_race") == "collector-first":
        return "forced"
    if mode == "sync" and drawn_from(d, "sync") > 0:
        return "aligned"
    return ""


def label(text: str, variant: str) -> str:
    """``text`` (a mode, a ratio) with its :func:`mode_variant` in brackets where it has one, as every page writes
    it: ``drain (forced)``, ``sync (aligned)``, ``2.087 (forced)``."""
    return f"{text} ({variant})" if variant else text


def mode_label(d: dict[str, Any], mode: str) -> str:
    """A run's ``mode`` as the pages name it (:func:`label`)."""
    return label(mode, mode_variant(d, mode))


def by_variant(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """Each measured mode of ``runs`` as ``(run, row)`` pairs, keyed by ``(mode, variant)`` (:func:`mode_variant`),
    in :data:`MODES`' order (a mode's plain runs before its variant's): a median or a bar never pools a forced drain
    or an aligned sync with the others."""
    out: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for m in MODES:
        pairs = [(d, r) for d in runs if (r := measured(d, m)) is not None]
        for d, r in sorted(pairs, key=lambda pair: mode_variant(pair[0], m) != ""):
            out.setdefault((m, mode_variant(d, m)), []).append((d, r))
    return out


def requests_per_engine_step(row: dict[str, Any]) -> float | None:
    """A mode's :func:`requests_per_step` in its first round; None where the row has no step profile."""
    return requests_per_step(first_profile(row))


def between_steps_ms(row: dict[str, Any]) -> float | None:
    """The time a mode's engine spent between megatron's steps, per step, in ms: its measured window's Generating
    and Draining (the engine has the GPU) less the time inside its profiled steps, over their count. That is the
    loop's own work per step (the direct loop: token intake, finish checks, the other threads' turns; megatron's
    coordinator loop: its scheduling and consensus between steps) and any wait with nothing to run. None where the
    row has no step profile or no state shares, or ran more than one round."""
    kinds = _engine_steps(first_profile(row))
    steps = sum(int(v["steps"]) for v in kinds)
    shares = row.get("state_share") or {}
    if not steps or not shares or "measured_s" not in row or len(row["engine_step_profile_per_round"]) != 1:
        return None  # the shares and the window cover every round, the profile one round
    busy_s = (shares.get("Generating", 0.0) + shares.get("Draining", 0.0)) * row["measured_s"]
    in_steps_s = sum(v["steps"] * v["ms_per_step"] for v in kinds) / 1e3
    return (busy_s - in_steps_s) / steps * 1e3


def unsteady(r: dict[str, Any]) -> str | None:
    """Why a mode's window was no steady state (None when it was, or when the row cannot say): it made more
    than :data:`~bench._handoff.MAX_BUFFER_GROWTH` more (or fewer) samples than it trained, so its buffer was
    filling (or emptying). Older JSON has no ``buffer_growth``; it is the same arithmetic on its own counts."""
    growth = unsteady_growth(r)
    if growth is None:
        return None
    made, trained = r["fresh_samples"], r["trained_samples"]
    return f"made {made:,} and trained {trained:,} in its window ({growth:+.0%}): its buffer was {buffer_trend(growth)}"


def in_median(d: dict[str, Any], r: dict[str, Any]) -> bool:
    """Whether a run's mode enters a median: by the rule a ratio is held to (:func:`bench._handoff.ratio_refusal`:
    at least ``MIN_STEPS`` measured steps, in steady state, some samples made), and by the run's own step minimum
    where its JSON states a higher one."""
    return r["measured_steps"] >= min_steps(d) and ratio_refusal("mode", r) is None


@dataclass(frozen=True)
class ModeFigures:
    """One mode's figures over the runs that measured it, from the runs in the median only (:func:`in_median`)."""

    median: float | None  # samples/s: the median of the runs' figures
    low: float | None  # the lowest single step of those runs
    high: float | None  # the highest single step of those runs
    runs: int  # how many runs are in the median
    steps: int  # their measured steps, together


def mode_figures(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> ModeFigures:
    """The median, single-step range and step count of a mode over ``(run, row)`` pairs (the page's summary row
    and the bars' height and whisker)."""
    counted = [r for d, r in rows if in_median(d, r)]
    rates = [r["samples_per_s"] for r in counted]
    spread = [r.get("step_samples_per_s") or {} for r in counted]
    return ModeFigures(
        median=statistics.median(rates) if rates else None,
        low=min((s["min"] for s in spread if "min" in s), default=None),
        high=max((s["max"] for s in spread if "max" in s), default=None),
        runs=len(counted),
        steps=sum(int(r["measured_steps"]) for r in counted),
    )


__all__ = [
    "HEADLINE_COMMITS",
    "MODES",
    "Key",
    "ModeFigures",
    "by_variant",
    "commits_arg",
    "drain_lost_its_race",
    "in_median",
    "is_handoff",
    "label",
    "load",
    "measured",
    "min_steps",
    "mode_figures",
    "mode_label",
    "mode_variant",
    "read_json",
    "split_history",
    "unsteady",
    "variant",
    "workload_model",
]
