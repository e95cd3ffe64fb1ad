"""What a machine's GPU lets park reach over sync and drain, run by run: park's ratio taken apart into what the
machine's CUDA-graph decode gives for running more requests per step, what each mode's engine loop keeps of that
decode, and what the measured window adds; and the ceiling, the engine-decode ratio park would reach with every
one of its slots decoding at the graph's own speed.

    python bench/park_ceiling.py            # every headline run with a graph-decode table from its own machine
    python bench/park_ceiling.py --smoke    # the first such run only

With ``g(b)`` the machine's graph decode in tokens/s at ``b`` requests (its table's step, linear between rows, at
the workload's mean decode context, linear in the context between the table's two contexts: a decode step is
linear in its context on the machines that timed every context), ``r`` a mode's engine decode tokens/s and ``c``
its tokens per decode step, for park and another mode ``x`` of one process::

    park / x (samples/s)  = window x batching x loops
    batching              = g(c_park) / g(c_x)                      what c_park requests a step give over c_x
    loops                 = (r_park / g(c_park)) / (r_x / g(c_x))   park's loop's share of the graph decode over x's
    window                = (park / x) / (r_park / r_x)             the window's samples per decoded token and
                                                                    share of time decoding, park's over x's
    batching at every slot = g(slots) / g(c_x)                      batching with all of park's slots decoding
    ceiling               = g(slots) / r_x                          park at every slot at the graph's speed

With the loops level, park's engine-decode ratio reaches at most *batching at every slot*; the ceiling bounds park's engine-decode ratio, not its samples/s ratio: a window can add a few percent either way
(a 3-step window counts samples whose tokens were decoded before it), and over a long run a colocated park,
paying the same training as x with a shorter generation, gains less in samples/s than in decode rate. The
table is the machine's: the run's own process's where it timed two contexts, else one its machine timed in
another process (a stages record, ``docs/gpu-runs/*stages*.json``, lists what one machine ran). Abort has no row:
it decodes at park's concurrency, and what parts them is its re-prefill (``bench/handoff_model.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import gpu_runs  # noqa: E402  (after the sys.path line above)
from bench import handoff_model as hm  # noqa: E402
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from bench.parking_map import TARGETS, standing_ratios  # noqa: E402

OTHERS = ("sync", "drain")
"""The modes park's ratio is taken apart against: those whose decode runs fewer requests a step than park's."""
STAGE_SLACK_S = 300.0
"""How far a run's end (its JSON's ``date`` plus ``total_s``) may lie from its stage's ``finished`` in a stages
record for the two to be one: a stage's process starts before the bench writes its date."""
Machine = tuple[str, str]  # (stages record's file, machine key: "machine1", or "" for a one-machine record)


@dataclass(frozen=True)
class Table:
    """A machine's graph decode (``graph_decode`` of the JSON in ``file``) as the handoff model reads it."""

    file: str
    baseline: hm.Baseline
    sizing: str = "default"  # the CUDA-graph sizing its engine captured (gpu_runs.graph_sizing)

    def rate(self, batch: float, context: int) -> float:
        """Decode tokens/s at ``batch`` requests from ``context`` tokens: the step linear between the table's rows
        (and along the nearest two past its ends), linear in the context through its two contexts."""
        ms = hm.Timing(self.baseline.table_at(context), host_ms=0.0).step_s(batch) * 1000.0
        return batch / ms * 1000.0

    def reaches(self, context: int) -> str:
        """Where ``context`` lies against the table's two contexts: ``between`` them, or ``beyond`` (extrapolated)."""
        lo, hi = sorted((self.baseline.context, self.baseline.context2 or self.baseline.context))
        return "between" if lo <= context <= hi else "beyond"


@dataclass(frozen=True)
class Row:
    """One park ratio taken apart (the module's docstring defines each figure)."""

    file: str
    commit: str
    engine: str
    cut: int
    max_age: int
    pair: str
    run: float
    engine_ratio: float
    batching: float
    loops: float
    window: float
    ceiling: float
    batching_every_slot: float  # g(slots) / g(c_x)
    park_loop: float  # r_park / g(c_park)
    other_loop: float  # r_x / g(c_x)
    park_requests: float  # c_park: tokens per decode step
    other_requests: float
    park_of_full: float  # g(c_park) / g(slots): the graph's rate at park's concurrency over every slot's
    slots: int
    context: int
    table: str  # "own", or the file of the machine's table timed in another process
    context_in_table: str  # "between" the table's two contexts, or "beyond" them (extrapolated)
    target: float | None  # the reasoning shape's target for this pair (max_age 2), None elsewhere
    park_in_step: float | None = None  # the graph alone over megatron's decode-only graph step in park's loop
    other_in_step: float | None = None  # the same for x (None: no step profile, as in committed coordinator runs)

    def check(self) -> float:
        """``window * batching * loops``: the run's ratio again (a row whose parts do not multiply back is wrong)."""
        return self.window * self.batching * self.loops


def _table(path: Path, data: Any) -> Table | None:
    """The JSON's graph decode as a :class:`Table`, where it timed two contexts (one alone gives no line)."""
    g = (data or {}).get("graph_decode") if isinstance(data, dict) else None
    if not isinstance(g, dict) or not g.get("rows_matched_context") or not g.get("matched_context_tokens"):
        return None
    try:
        _, baseline, _ = hm.workload_of(data, path.name)
    except hm.ConfigError:  # a graph decode without the shape it ran at: nothing to read it by
        return None
    if baseline.context2 in (None, baseline.context):
        return None
    return Table(path.name, baseline, gpu_runs.graph_sizing(g.get("graph_sizing")))


def stage_of(data: dict[str, Any]) -> str | None:
    """The ``bench.gpu`` stage a run was written by: the folder its command's ``--out`` names."""
    m = re.search(r"--out\s+(\S+)", str(data.get("command") or ""))
    parts = Path(m.group(1)).parts if m else ()
    return parts[-2] if len(parts) >= 2 else None


def _when(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def stage_records(folder: Path, files: gpu_runs.Files | None = None) -> list[tuple[Machine, str, str, float]]:
    """Every stage each stages record in ``folder`` (or ``files``, the folder as read) lists: ``(machine, commit,
    stage, finished)``, the commit its machine's record names, else the one in the record's file name
    (``...-stages-<commit>...``)."""
    out = []
    for path, data in gpu_runs.read_folder(folder) if files is None else files:
        if "stages" not in path.name or not isinstance(data, dict):
            continue
        m = re.search(r"stages-([0-9a-f]{7})", path.name)
        machines = {k: v for k, v in data.items() if k.startswith("machine") and isinstance(v, dict)}
        for key, record in machines.items() or {"": data}.items():
            commit = record.get("commit") or (m.group(1) if m else None)
            for stage, r in record.items():
                if isinstance(r, dict) and r.get("finished") and commit:
                    out.append(((path.name, key), str(commit), stage, _when(r["finished"])))
    return out


def machine_of(data: dict[str, Any], records: list[tuple[Machine, str, str, float]]) -> Machine | None:
    """The machine a run ran on, by the stages records: the one whose record of the run's commit and stage
    finished nearest the run's end, within :data:`STAGE_SLACK_S`; None where no record holds it."""
    stage, commit = stage_of(data), data.get("commit")
    if not stage or not data.get("date") or data.get("total_s") is None:
        return None
    end = _when(str(data["date"])) + float(data["total_s"])
    near = [(abs(t - end), machine) for machine, c, s, t in records if c == commit and s == stage]
    best = min(near, default=None)
    return best[1] if best and best[0] <= STAGE_SLACK_S else None


def machine_tables(files: gpu_runs.Files, records: list[tuple[Machine, str, str, float]]) -> dict[Machine, list[Table]]:
    """The graph-decode tables of two contexts each machine of ``records`` (:func:`stage_records`) timed, from a
    folder's ``files`` (:func:`~bench.gpu_runs.read_folder`)."""
    out: dict[Machine, list[Table]] = {}
    for path, data in files:
        table = _table(path, data)
        if table is not None and (machine := machine_of(data, records)) is not None:
            out.setdefault(machine, []).append(table)
    return out


def table_for(
    d: dict[str, Any],
    folder: Path,
    by_machine: dict[Machine, list[Table]],
    records: list[tuple[Machine, str, str, float]],
) -> Table | None:
    """The table run ``d`` is read against: its own process's, else its machine's (the first its machine timed),
    either only where its engine's CUDA graphs were sized as the run's were."""
    sizing = gpu_runs.graph_sizing(d.get("cuda_graph_sizing"))
    own = _table(folder / d["_file"], d)
    if own is not None and own.sizing == sizing:
        return own
    machine = machine_of(d, records)
    tables = [t for t in by_machine.get(machine, []) if t.sizing == sizing] if machine else []
    return tables[0] if tables else None


def in_step(row: dict[str, Any], table: Table, context: int) -> float | None:
    """The graph decode alone at the batch of a mode's decode-only graph steps over those steps' own time in its
    loop (the first round's step profile: megatron's step, as the loop ran it); None without a profile. The batch
    is the requests the steps decoded (``mean_ran``) where the profile has it, else the requests active after
    them. The graph alone is read at that mean; a profile that counts the steps per captured graph (``graphs``)
    says what each graph ran, which the report shows beside it."""
    g = (gpu_runs.first_profile(row) or {}).get("decode_graph")
    if not isinstance(g, dict) or not g.get("steps") or not g.get("ms_per_step"):
        return None
    batch = float(g["mean_ran"] if "mean_ran" in g else g["mean_active"])
    return batch / table.rate(batch, context) * 1000.0 / float(g["ms_per_step"])


def take_apart(d: dict[str, Any], other: str, table: Table, ratio: float) -> Row:
    """Park / ``other`` of run ``d`` (its JSON's ``ratio``) taken apart on ``table``."""
    shape = hm.Shape(**d["shape"])
    context = hm.workload_context(shape, int(d.get("seed", 0)))
    park, them = d["modes"]["park"], d["modes"][other]
    r_p, r_x = float(park["engine_decode_tokens_per_s"]), float(them["engine_decode_tokens_per_s"])
    c_p, c_x = float(park["tokens_per_decode_step"]), float(them["tokens_per_decode_step"])
    slots = shape.max_active_requests
    g_p, g_x, g_full = (table.rate(b, context) for b in (c_p, c_x, slots))
    cut, age = int(shape.max_tokens), int(shape.max_trajectory_age_steps)
    return Row(
        file=d["_file"],
        commit=str(d.get("commit")),
        engine=str(d.get("engine", "direct")),
        cut=cut,
        max_age=age,
        pair=f"park/{other}",
        run=ratio,
        engine_ratio=r_p / r_x,
        batching=g_p / g_x,
        loops=(r_p / g_p) / (r_x / g_x),
        window=ratio / (r_p / r_x),
        ceiling=g_full / r_x,
        batching_every_slot=g_full / g_x,
        park_loop=r_p / g_p,
        other_loop=r_x / g_x,
        park_requests=c_p,
        other_requests=c_x,
        park_of_full=g_p / g_full,
        slots=slots,
        context=context,
        table="own" if table.file == d["_file"] else table.file,
        context_in_table=table.reaches(context),
        target=TARGETS.get((cut, other)) if (d.get("model"), age) == ("gpt200m", 2) else None,
        park_in_step=in_step(park, table, context),
        other_in_step=in_step(them, table, context),
    )


def rows(folder: Path, commits: set[str], *, first_only: bool = False) -> list[Row]:
    """Every park / sync and park / drain ratio that stands (both modes pass the bench's rule) in a run of
    ``commits`` in ``folder`` on the 202M GPT's reasoning workload, with a graph-decode table from its machine; by
    cut, then pair, then file."""
    files = gpu_runs.read_folder(folder)  # each file read once, for the runs, the records and the tables
    runs, _ = gpu_runs.load(folder, files=files)
    records = stage_records(folder, files)
    by_machine = machine_tables(files, records)
    out: list[Row] = []
    for d in sorted((d for group in runs.values() for d in group), key=lambda d: d["_file"]):
        if d.get("commit") not in commits or d.get("workload") != "reasoning" or d.get("model") != "gpt200m":
            continue
        if not gpu_runs.on_page_card(d):
            continue  # the ranges the docs quote are the H200 machines'
        ratios = {m: v for m, v in standing_ratios(d).items() if m in OTHERS}
        table = table_for(d, folder, by_machine, records) if ratios else None
        if table is None:
            continue
        out += [take_apart(d, m, table, v) for m, v in sorted(ratios.items(), key=lambda kv: OTHERS.index(kv[0]))]
        if first_only and out:
            break
    return sorted(out, key=lambda r: (r.cut, OTHERS.index(r.pair.split("/")[1]), r.file))


def table_lines(found: list[Row]) -> list[str]:
    """The rows as a Markdown table (the performance page's and the command's)."""
    lines = [
        "| run | pair | park / x | engine decode | window | batching | loops (park's, x's) | graph alone / the loop's "
        "decode step (park's, x's) | requests a step (park, x) | batching at every slot | ceiling | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        table = "" if r.table == "own" else f" (table: `{r.table}`)"
        beyond = ", context past the table's: extrapolated" if r.context_in_table == "beyond" else ""
        in_steps = (
            f"{r.park_in_step:.2f}, {r.other_in_step:.2f}"
            if r.park_in_step is not None and r.other_in_step is not None
            else "no step profile"
        )
        lines.append(
            f"| `{r.file}`{table}{beyond} | {r.pair} | {r.run:.3f} | {r.engine_ratio:.3f} | {r.window:.2f} | "
            f"{r.batching:.2f} | {r.loops:.2f} ({r.park_loop:.2f}, {r.other_loop:.2f}) | {in_steps} | "
            f"{r.park_requests:.0f}, {r.other_requests:.0f} | {r.batching_every_slot:.2f} | **{r.ceiling:.2f}** | "
            f"{'' if r.target is None else f'{r.target:.1f}'} |"
        )
    return lines


def section(folder: Path, commits: set[str]) -> list[str]:
    """The performance page's section: the table, with what each column is (nothing where no run has a table)."""
    found = rows(folder, commits)
    if not found:
        return []
    return [
        "## What the GPU lets park reach",
        "",
        "Park's ratio in each headline run whose machine timed megatron's graph decode at two contexts "
        "(`python bench/park_ceiling.py`; its docstring defines each column): **park / x** = window x batching x "
        "loops. *Batching* is what the machine's graph decode gives for park's requests a step over x's; *loops* is "
        "park's engine loop's share of the graph decode at its concurrency over x's (each share in brackets); "
        "*window* is what the measured window adds (samples per decoded token, time decoding). *Batching at every "
        "slot* is what the graph gives with all of park's slots decoding: with the loops level, park's engine-decode "
        "ratio can reach no more. The **ceiling** is the engine-decode ratio park would reach with every slot decoding at the graph's "
        "own speed, x as measured. The target is the reasoning shape's, at `max_age` 2.",
        "",
        *table_lines(found),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/park_ceiling.py", description=__doc__.split("\n\n")[0])
    gpu_runs.add_reader_options(ap, ROOT / "bench" / "results" / "park_ceiling.json")
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    commits = gpu_runs.commits_read(ap, args)
    if not args.runs.is_dir():
        ap.error(f"--runs {args.runs}: a folder of committed runs")
    found = rows(args.runs, commits, first_only=args.smoke)
    if not found:
        ap.error(f"--commits {args.commits}: no run in {args.runs} has park / sync or park / drain standing and a "
                 "graph-decode table of two contexts from its machine")  # fmt: skip
    print("park_ceiling: park / x = window x batching x loops; ceiling: park at every slot at the graph's speed")
    print("\n".join(table_lines(found)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(
        json.dumps({"benchmark": "park_ceiling", "provenance": prov, "rows": [asdict(r) for r in found]}, indent=1)
    )
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
