"""The handoff model beside every committed GPU run that timed megatron's graph decode in its own process: each of
the run's park ratios, the model's from that run's own step table, and the model's from the default table.

    python bench/handoff_model_check.py            # every headline run with a graph decode of its own
    python bench/handoff_model_check.py --smoke    # the first such run only

A run's machine moves its rates by more than the modes differ (two processes of one command on one machine ran
their decode steps 14% apart), so the model's figure from one machine's table can be read against a run on
another only loosely. This puts the model on each run's own table, with the run's own point (cut, ``max_age``,
warm-up, measured steps, the prompts each mode drew), and says which table comes nearer the run. The model decodes
on colo-fsm's direct loop; a run on megatron's coordinator loop is shown, and marked, but the model's host costs
are the direct loop's. A drain whose handoff found nothing in flight lost its race with the trainer, which the
model does not play (its drain always waits): such a pair is shown and marked, never counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import gpu_runs  # noqa: E402  (after the sys.path line above)
from bench import handoff_model as hm  # noqa: E402
from bench._handoff import mode_of_ratio  # noqa: E402
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)

RACE = "drain lost its race at a handoff (found nothing in flight): the model's drain always waits"
COORDINATOR = "megatron's coordinator loop: the model's host costs are the direct loop's"
ONE_CONTEXT = "the run's graph decode has one context: its rows are taken at every context"
APART = 0.05
"""Tables whose model ratios differ by more than this tell apart; closer ones are read as agreeing."""


def model_rates(
    d: dict[str, Any], modes: list[str], baseline: hm.Baseline, shape: hm.Shape, seed: int
) -> dict[str, float]:
    """Each of ``modes``' samples/s in run ``d`` by the model on ``baseline``'s table, at the run's point: its cut,
    ``max_age`` and buffer order, each mode's warm-up (the JSON's ``warmup_steps``; where a run records none, its
    shape's warm-up, sync none) and measured steps, and the first prompt each mode drew."""
    sh = d["shape"]
    s = replace(
        shape,
        max_tokens=sh["max_tokens"],
        max_trajectory_age_steps=sh["max_trajectory_age_steps"],
        buffer_order=sh.get("buffer_order") or "start",
    )
    context = hm.workload_context(s, seed)
    timing = hm.Timing(baseline.table_at(context), kv_from=context)
    rate = {}
    for mode in modes:
        row = d["modes"][mode]
        warmup = (d.get("warmup_steps") or {}).get(mode, 0 if mode == "sync" else int(sh["warmup"]))
        steps = hm.run_mode(
            mode, s, timing, seed=seed, warmup=warmup, steps=row["measured_steps"], first=gpu_runs.drawn_from(d, mode)
        )
        rate[mode] = hm.summarize(mode, steps).samples_per_s
    return rate


def check(
    folder: Path, commits: set[str], default: Path = hm.WORKLOAD, *, first_only: bool = False
) -> list[dict[str, Any]]:
    """One row per park ratio of every run of ``commits`` in ``folder`` (the 202M GPT on the reasoning workload)
    whose JSON holds its own graph decode: the run's ratio, the model's from the run's own table and from
    ``default``'s, which is nearer, whether the two tables tell apart (``apart``), why a row is not counted
    (``note``) and what else to know of it (``remark``)."""
    shape, default_baseline, seed = hm.load_workload(default)
    runs, _ = gpu_runs.load(folder)
    rows: list[dict[str, Any]] = []
    for d in sorted((d for group in runs.values() for d in group), key=lambda d: d["_file"]):
        if d.get("commit") not in commits or d.get("workload") != "reasoning" or d.get("model") != "gpt200m":
            continue
        if not (d.get("graph_decode") or {}).get("rows"):
            continue
        if not gpu_runs.on_page_card(d):
            continue  # the default table was timed on the page's card: another card's run is no pair for it
        if d.get("seed", 0) != seed or any(d["shape"].get(k) != getattr(shape, k) for k in hm.SAME_SHAPE):
            continue  # another workload than the model's
        _, own, _ = hm.workload_of(d, d["_file"])
        ratios = {  # the run's park ratios by the other mode (drain_hold in a key: drain-hold), none per CPU-second
            other: figure
            for key, figure in sorted(d.items())
            if key.startswith("ratio_park_over_")
            and isinstance(figure, float)
            and (other := mode_of_ratio(key)) in hm.MODES
        }
        if not ratios:
            continue
        modes = ["park", *ratios]  # each mode modelled once per table, park shared by every pair
        mine_by_mode, theirs_by_mode = (model_rates(d, modes, b, shape, seed) for b in (own, default_baseline))
        for other, figure in ratios.items():
            notes = [COORDINATOR] if d.get("engine", "direct") != "direct" else []
            if other == "drain" and gpu_runs.drain_lost_its_race(d["modes"]["drain"]):
                notes.append(RACE)
            remark = ONE_CONTEXT if own.context2 is None else ""
            mine = mine_by_mode["park"] / mine_by_mode[other]
            theirs = theirs_by_mode["park"] / theirs_by_mode[other]
            rows.append(
                {
                    "file": d["_file"],
                    "commit": d["commit"],
                    "engine": d.get("engine", "direct"),
                    "cut": d["shape"]["max_tokens"],
                    "max_age": d["shape"]["max_trajectory_age_steps"],
                    "pair": f"park/{other}",
                    "run": figure,
                    "own_table": mine,
                    "default_table": theirs,
                    "own_nearer": abs(mine - figure) < abs(theirs - figure),
                    "apart": abs(mine - theirs) > APART,
                    "note": "; ".join(notes),  # why the pair is not counted
                    "remark": remark,
                }
            )
        if first_only and rows:
            break
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/handoff_model_check.py", description=__doc__.split("\n\n")[0])
    gpu_runs.add_reader_options(ap, ROOT / "bench" / "results" / "handoff_model_check.json")
    ap.add_argument("--workload", type=Path, default=hm.WORKLOAD, help="the run whose table is the model's default")
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    commits = gpu_runs.commits_read(ap, args)
    try:
        rows = check(args.runs, commits, args.workload, first_only=args.smoke)
    except hm.ConfigError as exc:
        ap.error(str(exc))
    if not rows:
        ap.error(f"no run of --commits {args.commits} in {args.runs} holds its own graph decode and a park ratio")
    # a commit named one by one and giving no row is refused; 'headline' names commits that may have none
    named = {c.strip() for c in args.commits.split(",")} - {"", "headline"}
    if (none := sorted(named - {r["commit"] for r in rows})) and not args.smoke:
        ap.error(f"--commits {args.commits}: no run of {', '.join(none)} in {args.runs} holds its own graph decode "
                 "and a park ratio")  # fmt: skip
    print(f"handoff_model_check (a model, not a measurement): park's ratios, the run's, the model's on the run's own "
          f"graph-decode table and on {args.workload.name}'s")  # fmt: skip
    width = max(len(r["file"]) - 5 for r in rows)
    print(f"{'run':<{width}} {'pair':<11} {'run':>6} {'own':>5} {'default':>7}  nearer")
    for r in rows:
        nearer = "own" if r["own_nearer"] else "default"
        print(
            f"{r['file'][:-5]:<{width}} {r['pair']:<11} {r['run']:>6.3f} {r['own_table']:>5.2f} "
            f"{r['default_table']:>7.2f}  "
            f"{nearer if r['apart'] else 'level'}{''.join(f' ({x})' for x in (r['note'], r['remark']) if x)}"
        )
    counted = [r for r in rows if not r["note"]]
    apart = [r for r in counted if r["apart"]]
    print(f"{len(counted)} pairs on the direct loop with no race; the two tables more than {APART} apart in "
          f"{len(apart)}, and the run's own table nearer in {sum(r['own_nearer'] for r in apart)} of them; 'level': "
          "the tables agree")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(
        json.dumps(
            {"benchmark": "handoff_model_check", "provenance": prov, "workload": args.workload.name, "rows": rows},
            indent=1,
        )
    )
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
