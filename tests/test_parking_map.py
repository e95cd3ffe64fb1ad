"""bench/parking_map.py: the map of where parking pays, from the runs' own ratios, and the README's copy of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpu_report, gpu_runs, parking_map  # noqa: E402
from bench._handoff import ratio_name, ratio_refusal  # noqa: E402

HEADLINE = gpu_runs.HEADLINE_COMMITS  # the commits PERFORMANCE.md is generated from


def _mode(rate: float, steps: int = 3, made: int = 768) -> dict:
    return {
        "samples_per_s": rate,
        "measured_steps": steps,
        "fresh_samples": made,
        "trained_samples": 768,
    }


def _run(modes: dict, cut: int = 8192, age: int = 2, engine: str = "direct", model: str = "gpt200m", **ratios) -> dict:
    return {
        "model": model,
        "engine": engine,
        "shape": {"max_tokens": cut, "max_trajectory_age_steps": age},
        "modes": modes,
        **{f"ratio_park_over_{k}": v for k, v in ratios.items()},
    }


def test_a_ratio_stands_only_where_both_of_its_modes_pass_the_benchs_rule():
    """Each ratio the JSON gives, by the mode it divides by; none beside a park, or another mode, with fewer than 3
    measured steps, a filling buffer, or no sample made; the CPU-time and per-round ratios are not figures."""
    ok = _run(
        {"park": _mode(8.0), "drain": _mode(5.0), "drain-hold": _mode(7.0)},
        drain=1.6,
        drain_hold=1.143,
        drain_cpu=1.5,
        drain_per_round=[1.6],
    )
    assert parking_map.standing_ratios(ok) == {"drain": 1.6, "drain-hold": 1.143}
    short = _run({"park": _mode(8.0), "sync": _mode(4.0, steps=2)}, sync=2.0)
    assert parking_map.standing_ratios(short) == {}
    filling = _run({"park": _mode(8.0, made=1280), "sync": _mode(4.0)}, sync=2.0)
    assert parking_map.standing_ratios(filling) == {}
    nothing = _run({"park": _mode(8.0), "drain": _mode(0.0)}, drain=float("inf"))
    assert parking_map.standing_ratios(nothing) == {}


def test_a_drain_whose_race_was_forced_is_marked_on_the_map():
    """A run with ``--drain-race collector-first`` enters the map beside the free ones, its drain ratio marked."""
    free = _run({"park": _mode(8.0), "drain": _mode(5.0)}, drain=1.6)
    forced = {**_run({"park": _mode(8.0), "drain": _mode(4.0)}, drain=2.0), "drain_race": "collector-first"}
    [row] = parking_map.map_rows([free, forced])
    assert row.cell("drain") == "1.600, 2.000 (forced)" and row.values("drain") == [1.6, 2.0]
    assert row.ratios["drain"] == [parking_map.MapRatio(1.6), parking_map.MapRatio(2.0, "forced")]
    assert "(forced)" in parking_map.INTRO
    both = _run({"park": _mode(8.0), "drain": _mode(4.0), "sync": _mode(4.0)}, drain=2.0, sync=2.0)
    [row] = parking_map.map_rows([{**both, "drain_race": "collector-first"}])
    assert row.cell("sync") == "2.000", "only drain's race is forced: the sync beside it is not marked"


def test_a_sync_drawn_from_parks_prompts_is_marked_on_the_map_and_in_the_run_list():
    """A run whose sync drew its prompts from where park's measured steps start (the bench's ``first_prompt``)
    enters the map beside the runs that drew sync from the stream's first prompt, never pooled unlabelled."""
    pair = {"park": _mode(8.0), "sync": _mode(4.0), "drain": _mode(5.0)}
    before = _run(pair, sync=2.0, drain=1.6)
    aligned = {**_run(pair, sync=2.0, drain=1.6), "first_prompt": {"park": 0, "sync": 32, "drain": 0}}
    [row] = parking_map.map_rows([before, aligned])
    assert row.cell("sync") == "2.000, 2.000 (aligned)" and row.values("sync") == [2.0, 2.0]
    assert row.cell("drain") == "1.600, 1.600", "only sync draws elsewhere: the drain beside it is not marked"
    assert "(aligned)" in parking_map.INTRO
    assert gpu_runs.mode_variant({**before, "first_prompt": {"park": 0, "sync": 0}}, "sync") == ""
    listed = gpu_report.run_list([{**aligned, "_file": "a.json", "commit": "abc1234"}])
    assert "sync's prompts aligned" in listed[0]


def test_a_points_medians_keep_a_forced_drain_and_an_aligned_sync_apart():
    """The page's per-point summary gives a forced drain and an aligned sync rows of their own, so a median never
    pools them with the drains left free or the syncs drawn from the first prompt (the bars read the same rows)."""
    free = _run({"park": _mode(8.0), "drain": _mode(6.0), "sync": _mode(4.0)}, drain=1.333, sync=2.0)
    forced = {**_run({"park": _mode(8.0), "drain": _mode(4.0)}, drain=2.0), "drain_race": "collector-first"}
    aligned = {**_run({"park": _mode(8.0), "sync": _mode(3.0)}, sync=2.667), "first_prompt": {"park": 0, "sync": 32}}
    runs = [{**d, "_file": f"{i}.json", "commit": "abc1234"} for i, d in enumerate([aligned, forced, free])]
    groups = gpu_runs.by_variant(runs)
    assert [gpu_runs.label(*key) for key in groups] == ["park", "drain", "drain (forced)", "sync", "sync (aligned)"]
    assert [r["samples_per_s"] for _, r in groups[("sync", "aligned")]] == [3.0]
    page = "\n".join(gpu_report.workload_section(("gpt200m", 8192, 2), runs))
    assert "| drain | 6.00 | 6.00 (3) | 3 |" in page and "| drain (forced) | 4.00 | 4.00 (3) | 3 |" in page
    assert "| sync | 4.00 | 4.00 (3) | 3 |" in page and "| sync (aligned) | 3.00 | 3.00 (3) | 3 |" in page
    assert "| `0.json` | sync (aligned) | 3.00 |" in page  # each run's row says so too


def test_the_maps_picture_marks_each_ratio_and_says_where_a_point_has_none():
    """The picture draws one dot per one-process ratio at its value, and a point where no process measured park
    beside another mode with a figure says so in words, rather than showing an empty row."""
    from bench import gpu_plots

    plt = gpu_plots._pyplot()
    runs = [
        _run({"park": _mode(8.0), "drain": _mode(5.0)}, drain=1.6),
        _run({"park": _mode(6.2), "drain": _mode(3.1, steps=1)}, cut=32768, engine="coordinator"),
    ]
    fig, ax = plt.subplots()
    try:
        gpu_plots.draw_map(ax, parking_map.map_rows(runs))
        dots = [x for line in ax.get_lines() if line.get_marker() == "o" for x in line.get_xdata()]
        notes = [(text.get_text(), text.get_position()[1]) for text in ax.texts]
    finally:
        plt.close(fig)
    assert dots == [1.6]
    # the map's first row is drawn at the top: the 8,192 point at y=1, the 32,768 one (no ratio) at y=0
    assert [y for text, y in notes if text == gpu_plots.NO_RATIO_YET] == [0]


def test_a_median_takes_a_mode_by_the_rule_a_ratio_is_held_to():
    """The page's medians and the map's ratios read one rule: a mode enters a median exactly where it could enter
    a ratio (3 or more measured steps, steady state, some samples made), and a JSON's own stated minimum holds."""
    cases = [_mode(8.0), _mode(4.0, steps=2), _mode(8.0, made=1280), _mode(0.0), _mode(5.0, steps=4)]
    for row in cases:
        assert gpu_runs.in_median({}, row) == (ratio_refusal("drain", row) is None), row
    assert not gpu_runs.in_median({"min_steps_for_a_ratio": 5}, _mode(5.0, steps=4))


def test_the_map_has_a_row_per_point_and_every_runs_ratio_in_it():
    """One row per (cut, max_age, engine loop, model), in that order; a point's ratios oldest run first; a mode
    whose figures stand only beside no park says ``no ratio``, one that ran without a figure ``no figure``, one
    never run ``-``; a column only for a mode run somewhere; park's rate from every run whose park stands."""
    runs = [
        _run({"park": _mode(8.0), "drain": _mode(5.0)}, drain=1.6),
        _run({"park": _mode(7.0), "drain": _mode(5.6), "sync": _mode(4.6)}, drain=1.25, sync=1.522),
        _run({"park": _mode(5.5), "sync": _mode(3.5)}, cut=32768, sync=1.571),
        _run({"park": _mode(9.0), "abort": _mode(8.6)}, engine="coordinator", abort=1.047),
        _run({"drain": _mode(5.2), "sync": _mode(5.0)}, engine="coordinator"),
        _run({"park": _mode(6.0, steps=2), "sync": _mode(4.0)}, model="gpt1b"),
        _run({"park": _mode(6.2), "drain": _mode(3.1, steps=1)}, cut=32768, engine="coordinator"),
    ]
    table = parking_map.map_table(runs)
    assert table[0] == (
        "| cut | max_age | engine loop | model | park / drain | park / sync | park / abort | park samples/s, each run |"
    )
    assert table[2:] == [
        "| 8,192 | 2 | coordinator | gpt200m | no ratio | no ratio | 1.047 | 9.00 |",
        "| 8,192 | 2 | direct | gpt1b | - | no ratio | - | - |",
        "| 8,192 | 2 | direct | gpt200m | 1.600, 1.250 | 1.522 | - | 8.00, 7.00 |",
        "| 32,768 | 2 | coordinator | gpt200m | no figure | - | - | 6.20 |",
        "| 32,768 | 2 | direct | gpt200m | - | 1.571 | - | 5.50 |",
    ]
    section = parking_map.map_section(runs)
    assert section[0] == "### Where parking pays: the map" and parking_map.INTRO in section


def test_the_page_opens_its_headline_with_the_map(tmp_path):
    """The performance page carries the map of its headline's runs, after the picture and before the first point's
    section; an older commit's run is not on it."""
    for name, run, commit in (
        ("new.json", _run({"park": _mode(8.0), "drain": _mode(5.0)}, drain=1.6), "abc1234"),
        ("old.json", _run({"park": _mode(9.0), "drain": _mode(3.0)}, drain=3.0), "0ld0000"),
    ):
        run.update(benchmark="inflight_handoff", commit=commit, machine={"device": "NVIDIA H200"})
        run["date"] = "2026-12-02T01:00:00+00:00" if commit == "abc1234" else "2026-12-01T01:00:00+00:00"
        (tmp_path / name).write_text(json.dumps(run))
    page = tmp_path / "PERFORMANCE.md"
    argv = [str(tmp_path), "--out", str(page), "--commits", "abc1234", "--plot", str(tmp_path / "bars.png")]
    assert gpu_report.main(argv) == 0
    head = page.read_text().split("## History")[0]
    assert head.index("### Where parking pays: the map") < head.index("### gpt200m, output lengths cut at 8,192")
    assert "| 8,192 | 2 | direct | gpt200m | 1.600 | 8.00 |" in head and "3.000" not in head
    assert (tmp_path / "bars-map.png").stat().st_size > 0  # the map's picture, beside the bars, on the page
    assert head.index("![where parking pays: the map](bars-map.png)") < head.index("### gpt200m, output lengths")


def test_the_readme_quotes_the_committed_map_verbatim():
    """The README's map is the one the committed headline runs give, line for line: a ratio edited in the README,
    or a run added to the headline without the README following, turns this red."""
    _, head, _ = gpu_runs.split_history(gpu_runs.load(ROOT / "docs" / "gpu-runs")[0], HEADLINE)
    table = parking_map.map_table([d for runs in head.values() for d in runs])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n".join(table) in readme, "README.md's map of where parking pays differs from the runs':\n" + "\n".join(
        table
    )


def test_the_committed_page_is_what_the_report_writes_from_the_committed_files(tmp_path, monkeypatch):
    """PERFORMANCE.md is the report's output from the files beside it, its notes included: a run added, a note
    edited or a figure changed by hand without regenerating the page turns this red. The line that names the
    report's command (which holds the output paths) is the only one left out."""
    runs = ROOT / "docs" / "gpu-runs"
    page = tmp_path / "PERFORMANCE.md"
    notes = runs / "PERFORMANCE.notes.md"
    argv = [str(runs), "--out", str(page), "--commits", "headline", "--notes", str(notes)]
    monkeypatch.setattr(gpu_report, "plot_bars", lambda *a, **k: None)  # the pictures' files are not the page
    monkeypatch.setattr(gpu_report, "plot_map", lambda *a, **k: None)
    assert gpu_report.main([*argv, "--plot", str(tmp_path / "where-parking-pays.png")]) == 0

    def body(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("Generated by `python -m bench.gpu report")]

    committed = (runs / "PERFORMANCE.md").read_text(encoding="utf-8")
    assert body(page.read_text(encoding="utf-8")) == body(committed), (
        "regenerate docs/gpu-runs/PERFORMANCE.md (docs/gpu-runs/README.md says how)"
    )


def test_every_headline_run_is_named_for_its_workload_cut_and_commit_and_gives_its_ratios_at_top_level():
    """The committed evidence as a reader finds it: each headline JSON's name holds ``reasoning``, its cut and its
    commit (and ``gpt1b`` or ``age1`` where it leaves the default model or age, ``collector-first`` where drain's
    race was forced); each of its modes ran 3 or more measured steps, or the JSON says why it gives no ratio; every
    ratio is a top-level key; the runs since the in-flight record (6f74238) carry one count per measured handoff of
    every mode with a collector."""
    _, head, _ = gpu_runs.split_history(gpu_runs.load(ROOT / "docs" / "gpu-runs")[0], HEADLINE)
    runs = [d for rs in head.values() for d in rs]
    assert len(runs) == 57
    for d in runs:
        name, cut = d["_file"], d["shape"]["max_tokens"]
        assert "reasoning" in name and f"cut{cut}" in name and d["commit"] in name, name
        if d["model"] != "gpt200m":
            assert d["model"] in name, name
        if d["shape"]["max_trajectory_age_steps"] != 2:
            assert f"age{d['shape']['max_trajectory_age_steps']}" in name, name
        short = [m for m, r in d["modes"].items() if r.get("measured_steps", 0) < 3]
        assert all(any(m in why for why in d["no_ratio"].values()) for m in short), (name, short)
        for other in [m for m in d["modes"] if m != "park" and "park" in d["modes"]]:  # a ratio, or why none
            assert f"ratio_{ratio_name(other)}" in d or ratio_name(other) in d["no_ratio"], (name, other)
        if d.get("drain_race", "free") != "free":  # a forced race is never pooled unlabelled
            assert d["drain_race"] in name, name
        if d["commit"] in HEADLINE[HEADLINE.index("6f74238") :]:  # the runs since the in-flight record
            for m, r in d["modes"].items():
                if m != "sync":
                    assert len(r["groups_in_flight_at_handoff"]) == r["measured_steps"], (name, m)


def test_on_the_coordinator_loop_at_8192_park_over_sync_is_the_ratio_of_the_two_modes_engine_decode_rates():
    """What the notes make of the coordinator path's four park / sync processes at 8,192 (``4366d6d`` and
    ``dec9bed`` with sync from the stream's first prompt, ``b1d9af0`` on two machines with sync on park's prompts):
    the admission is the same in all four (park's 119.5 tokens per decode step; sync's 39.6-40.2, the same engine
    steps whichever prompts it drew), so each ratio is, within 0.013, the ratio of the two modes' engine decode
    rates in its process: the machine's speed at sync's ~40-request steps against park's ~120 sets it, and drawing
    sync from park's prompts did not raise it here (1.453-1.691)."""
    _, head, _ = gpu_runs.split_history(gpu_runs.load(ROOT / "docs" / "gpu-runs")[0], HEADLINE)
    every = [  # on megatron's default graph sizing (the linear sizing's park / sync: 1.537 on an H100 at 73940c4)
        d
        for runs in head.values()
        for d in runs
        if d["engine"] == "coordinator"
        and d["shape"]["max_tokens"] == 8192
        and "ratio_park_over_sync" in d
        and gpu_runs.graph_sizing(d.get("cuda_graph_sizing")) != "linear"
    ]
    pairs = [d for d in every if d.get("ep_consensus_interval") in (None, 20)]  # megatron's own pause consensus
    assert sorted(d["commit"] for d in pairs) == ["4366d6d", "b1d9af0", "b1d9af0", "dec9bed"]
    # the three with the pause checked every step (3385c87, and the four modes in one process of 3c2b2f0 and of
    # 1c1ac8d, the last on an H100): the same admission and engine steps, and each window took a little more off
    # the engine-decode ratio (1.589 against 1.612, 1.584 against 1.596, 1.591 against 1.605)
    every_step = {}
    for d in (d for d in every if d not in pairs):
        park, sync = d["modes"]["park"], d["modes"]["sync"]
        assert d["ep_consensus_interval"] == 1 and round(park["tokens_per_decode_step"], 1) == 119.5
        assert sync["measured_s"] * sync["decode_steps_per_s"] == pytest.approx(24_580, rel=0.002)
        engine = park["engine_decode_tokens_per_s"] / sync["engine_decode_tokens_per_s"]
        every_step[d["commit"]] = (round(d["ratio_park_over_sync"], 3), round(engine, 3))
    assert every_step == {"3385c87": (1.589, 1.612), "3c2b2f0": (1.584, 1.596), "1c1ac8d": (1.591, 1.605)}
    got = {}
    for d in pairs:
        park, sync = d["modes"]["park"], d["modes"]["sync"]
        assert round(park["tokens_per_decode_step"], 1) == 119.5 and 39.5 < sync["tokens_per_decode_step"] < 40.3
        assert sync["measured_s"] * sync["decode_steps_per_s"] == pytest.approx(24_580, rel=0.002), d["_file"]
        engine = park["engine_decode_tokens_per_s"] / sync["engine_decode_tokens_per_s"]
        assert abs(d["ratio_park_over_sync"] - engine) < 0.013, (d["_file"], engine)
        got[d["_file"]] = (round(d["ratio_park_over_sync"], 3), gpu_runs.mode_variant(d, "sync"))
    assert sorted(got.values()) == [(1.453, "aligned"), (1.588, "aligned"), (1.626, ""), (1.691, "")]


def test_a_run_on_linearly_sized_cuda_graphs_is_a_point_of_its_own():
    """A run whose megatron captured its graphs other than by its default (``--graph-sizing linear``) is never
    pooled with the default's runs on the map; megatron's default named ("exponential") is the default's point."""
    modes = {"park": _mode(8.0), "sync": _mode(4.0)}
    plain = _run(modes, sync=2.0)
    linear = {**plain, "cuda_graph_sizing": "linear"}
    named = {**plain, "cuda_graph_sizing": "exponential"}
    assert parking_map.point_of(plain) == parking_map.point_of(named)
    assert parking_map.point_of(linear) != parking_map.point_of(plain)
    assert parking_map.point_of(linear)[3] == "gpt200m with linear CUDA graphs"
    assert len(parking_map.map_rows([plain, linear, named])) == 2
