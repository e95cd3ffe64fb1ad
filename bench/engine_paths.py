"""The two engine paths side by side in one run: colo-fsm's direct engine against megatron-core's coordinator mode.

Runs ``bench/inflight_handoff.py`` once per engine (``--engine direct``, then ``--engine coordinator``) with the
same arguments (workload, modes, steps, KV buffer, graphs), in this one process, and writes one JSON with both
and, per mode, the ratios coordinator / direct of trained samples per second and of ``step_wall_ms``: the
wall-clock per engine step while the engine had work (``(1 - engine_idle_share) / decode_steps_per_s``), the
forward plus every host cost of a step (colo-fsm's per-step bookkeeping on the direct path, megatron's own on
both). The engines run one after the other, not interleaved: compare ratios from one run, on one machine.

    python bench/engine_paths.py --workload reasoning --modes park,sync          # the reasoning workload
    python bench/engine_paths.py --device cuda --model gpt200m --quick --steps 3 --modes park,drain,sync

Both engines follow the handoff bench's rules: each mode runs ``--steps`` measured steps after its warm-up, on one
engine built once per engine path, and a ratio is given only where both paths ran the mode for 3 or more measured
steps (``no_ratio`` says why otherwise).

Every argument but ``--engine`` and ``--out`` goes to ``inflight_handoff.py``. Writes
``bench/results/engine_paths.json`` (``--out`` to change) and each engine's own JSON beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "engine_paths.json"
PATHS = ("direct", "coordinator")

from bench._handoff import ratio_refusal  # noqa: E402  (after the sys.path line above)
from bench._provenance import provenance  # noqa: E402


def coordinator_unavailable() -> str | None:
    """Why megatron-core's coordinator mode cannot run on this machine (None when it can)."""
    import torch

    from colo_fsm.adapters.megatron.coordinator import coordinator_dependencies

    if not torch.cuda.is_available():
        return "no CUDA device"
    ok, why = coordinator_dependencies()
    return None if ok else why


def step_wall_ms(row: dict[str, Any]) -> float:
    """Wall-clock milliseconds per engine step while the engine had work (NaN without steps)."""
    rate = float(row.get("decode_steps_per_s") or 0.0)
    if rate <= 0:
        return float("nan")
    return 1e3 * (1.0 - float(row.get("engine_idle_share") or 0.0)) / rate


def compare(per_engine: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Per mode: each engine's samples/s and step_wall_ms, and the ratios coordinator / direct, only where both
    engines ran the mode for :data:`~bench._handoff.MIN_STEPS` measured steps or more; the second dict says why
    a mode has no ratio."""
    out: dict[str, dict[str, float]] = {}
    no_ratio: dict[str, str] = {}
    direct = per_engine.get("direct", {}).get("modes", {})
    coord = per_engine.get("coordinator", {}).get("modes", {})
    for m in sorted(set(direct) | set(coord)):
        d, c = direct.get(m), coord.get(m)
        why = ratio_refusal(f"direct {m}", d) or ratio_refusal(f"coordinator {m}", c)
        if why:
            no_ratio[m] = why
            continue
        assert d is not None and c is not None
        row = {
            "direct_samples_per_s": d["samples_per_s"],
            "coordinator_samples_per_s": c["samples_per_s"],
            "direct_measured_steps": d["measured_steps"],
            "coordinator_measured_steps": c["measured_steps"],
            "direct_step_wall_ms": step_wall_ms(d),
            "coordinator_step_wall_ms": step_wall_ms(c),
            "direct_handoff_p50_ms": d.get("handoff_p50_ms", float("nan")),
            "coordinator_handoff_p50_ms": c.get("handoff_p50_ms", float("nan")),
            "direct_engine_decode_tokens_per_s": d.get("engine_decode_tokens_per_s", float("nan")),
            "coordinator_engine_decode_tokens_per_s": c.get("engine_decode_tokens_per_s", float("nan")),
        }
        row["ratio_samples_per_s"] = row["coordinator_samples_per_s"] / row["direct_samples_per_s"]
        row["ratio_step_wall_ms"] = row["coordinator_step_wall_ms"] / row["direct_step_wall_ms"]
        out[m] = row
    return out, no_ratio


COORDINATOR_ONLY = ("--ep-consensus-interval",)
"""Options of the handoff bench only the coordinator loop takes: given to its run, left out of the direct one's."""


def argv_for(engine: str, rest: list[str]) -> list[str]:
    """The handoff bench's arguments for one engine path: ``rest`` less, for the direct path, the options only the
    coordinator loop takes (:data:`COORDINATOR_ONLY`, with their values)."""
    if engine == "coordinator":
        return list(rest)
    out: list[str] = []
    skip = False
    for a in rest:
        if skip:
            skip = False
        elif a in COORDINATOR_ONLY:
            skip = True
        elif not any(a.startswith(f"{o}=") for o in COORDINATOR_ONLY):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run both engine paths, print the comparison table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--engines", default=",".join(PATHS), help="comma-separated subset of direct,coordinator")
    args, rest = ap.parse_known_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    if any(a == "--engine" or a.startswith("--engine=") for a in rest):
        ap.error("--engine is set by this script (use --engines)")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in PATHS for e in engines):
        ap.error(f"--engines {args.engines!r}: each one of {PATHS}")
    if "coordinator" in engines:
        why = coordinator_unavailable()
        if why:
            print(f"engine_paths: the coordinator path cannot run here ({why}); nothing to compare")
            return 0
    from bench import inflight_handoff

    out_path = Path(args.out)
    per_engine: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for engine in engines:
        path = out_path.with_name(f"{out_path.stem}_{engine}.json")
        print(f"=== engine {engine}", flush=True)
        try:
            rc = inflight_handoff.main([*argv_for(engine, rest), "--engine", engine, "--out", str(path)])
        except Exception as exc:  # one engine path failing must not lose the other's numbers
            rc = 1
            errors[engine] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        if path.exists():
            per_engine[engine] = json.loads(path.read_text(encoding="utf-8"))
        if rc:
            print(f"=== engine {engine}: inflight_handoff returned {rc}", flush=True)
    table, no_ratio = compare(per_engine)
    print()
    cols = ["mode", "direct s/s", "coord s/s", "ratio", "direct ms/step", "coord ms/step", "ratio", "handoff d/c ms"]
    print("  ".join(f"{c:>14}" for c in cols))
    for m, r in table.items():
        cells = [
            m,
            f"{r['direct_samples_per_s']:.2f}",
            f"{r['coordinator_samples_per_s']:.2f}",
            f"{r['ratio_samples_per_s']:.2f}",
            f"{r['direct_step_wall_ms']:.2f}",
            f"{r['coordinator_step_wall_ms']:.2f}",
            f"{r['ratio_step_wall_ms']:.2f}",
            f"{r['direct_handoff_p50_ms']:.1f}/{r['coordinator_handoff_p50_ms']:.1f}",
        ]
        print("  ".join(f"{c:>14}" for c in cells))
    for m, why in no_ratio.items():
        print(f"no ratio for {m}: {why}")
    result = {
        "benchmark": "engine_paths",
        "provenance": prov,
        "command": " ".join(["python3", "bench/engine_paths.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": next((r.get("commit") for r in per_engine.values() if r.get("commit")), None),
        "date": next((r.get("date") for r in per_engine.values() if r.get("date")), None),
        "engines": engines,
        "compare": table,
        "no_ratio": no_ratio,
        "errors": errors,
        "runs": per_engine,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
    tmp.replace(out_path)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":  # import-safe: megatron's coordinator process is started with multiprocessing spawn
    sys.exit(main())
