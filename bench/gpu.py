"""All of colo-fsm's GPU evidence, one command: named stages, each with a time budget, resumable across calls.

    python -m bench.gpu --list                                  # the stages, what each measures, its budget
    python -m bench.gpu --out gpu-out --budget-s 540            # every single-GPU stage not done yet, in order
    python -m bench.gpu --out gpu-out --stages reasoning-8k-park-abort,tests --bundle $OUT/gpu-out.tgz
    python -m bench.gpu --smoke --out /tmp/gpu-smoke            # every stage's CPU twin, in seconds each
    python -m bench.gpu report docs/gpu-runs --out docs/gpu-runs/PERFORMANCE.md   # (CPU) the docs' tables (--plot, --notes)

A stage is named for what it measures (:data:`bench.gpu_stages.STAGES`); it runs as a child process under its own timeout, capped
by what is left of ``--budget-s``; a stage that cannot finish in what is left is skipped (and said so), and one
that needs more GPUs than the machine has is skipped with that reason. Each stage writes its JSON as it goes,
so a stage cut by its timeout keeps what it measured. ``OUT/stages.json`` records every stage's outcome (and, for
each JSON that counts its rounds, whether it is whole, so rc 124 after the last write is told apart): a later
call with the same ``--out`` runs only the stages not yet done (``--redo`` runs them again). ``--bundle`` packs
``OUT`` into one archive after every stage (a time-limited remote call returns one file, whole or cut). A stage
longer than one remote call (``reasoning-32k``) runs detached: ``--detach`` starts the runner in a process
session of its own and returns; ``--wait S`` in the next calls follows it (on a machine that stays warm between
calls).

It installs nothing: megatron-core, flash-attention and the rest must be importable (``docs/megatron.md`` says
how to carry them to a machine without a package registry). Every figure in ``docs/gpu-runs/`` names the stage
and the JSON it came from (``docs/gpu-runs/README.md``); ``report`` regenerates ``PERFORMANCE.md`` from the
committed JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PY = sys.executable

from bench.gpu_stages import BY_NAME, NAME_WIDTH, STAGES, Stage  # noqa: E402  (the stage table)

MIN_LEFT_S = 60  # a stage is not started with less than this left of the call's budget


def gpu_count() -> int:
    """CUDA devices here (0 without torch or a GPU)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # no torch: nothing to run on
        return 0


def load_state(out: Path) -> dict[str, Any]:
    """``OUT/stages.json`` (empty if none yet)."""
    path = out / "stages.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def save_state(out: Path, state: dict[str, Any]) -> None:
    """Rewrite ``OUT/stages.json`` atomically."""
    tmp = out / "stages.json.tmp"
    tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
    tmp.replace(out / "stages.json")


def bundle(out: Path, path: Path | None) -> None:
    """Pack ``out`` into ``path`` (a .tgz), if asked."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    tmp.replace(path)


def whole(path: Path) -> bool | None:
    """Whether the bench JSON at ``path`` finished every round it planned (``rounds_done`` against ``rounds``), so a
    stage stopped by its cap after writing can be told from one stopped before; None where it records neither."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # a JSON that cannot be read is not whole
    if not isinstance(data, dict) or "rounds" not in data or "rounds_done" not in data:
        return None
    return int(data["rounds_done"] or 0) >= int(data["rounds"] or 0)


def wholeness(outcome: dict[str, Any]) -> str:
    """What a stage's outcome line says of its JSON: ``its JSON whole``, ``JSON cut short: <files>``, or nothing
    where no output records its rounds."""
    marks = outcome.get("whole") or {}
    if not marks:
        return ""
    short = [rel for rel, ok in marks.items() if not ok]
    return f"; JSON cut short: {', '.join(short)}" if short else "; its JSON whole"


def run_stage(stage: Stage, out: Path, timeout_s: float, *, smoke: bool) -> dict[str, Any]:
    """Run one stage as a child process (its own folder, its own log); returns its outcome."""
    folder = out / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    cmd = stage.command(folder, smoke=smoke, python=PY)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on a shared host
    env.setdefault("LOCAL_RANK", "0")
    t0 = time.monotonic()
    with open(folder / "log.txt", "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
            cut = False
        except subprocess.TimeoutExpired:
            rc, cut = 124, True
    outputs = sorted(str(p.relative_to(out)) for p in folder.rglob("*.json"))
    return {
        "rc": rc,
        "cut_by_timeout": cut,
        "seconds": round(time.monotonic() - t0, 1),
        "timeout_s": round(timeout_s),
        "command": " ".join(cmd),
        "smoke": smoke,
        "outputs": outputs,
        "whole": {rel: ok for rel in outputs if (ok := whole(out / rel)) is not None},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def headline(out: Path, name: str, outcome: dict[str, Any]) -> str:
    """One line of what a stage measured (its ratios, or its test counts)."""
    parts = []
    for rel in outcome.get("outputs", []):
        try:
            data = json.loads((out / rel).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for k, v in data.items():
            if k.startswith("ratio_park_over_") and not k.endswith(("_cpu", "_per_round")) and isinstance(v, float):
                parts.append(f"{k[6:]}={v:.2f}")
        for k, why in (data.get("no_ratio") or {}).items():
            parts.append(f"no {k}: {why}")
    log = out / name / "log.txt"
    if name == "tests" and log.exists():
        tail = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if " in " in line]
        parts += tail[-1:]
    return "; ".join(parts)[:200]


def run(argv: list[str]) -> int:
    """The stage runner (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "gpu-out", help="output folder (resumable; default gpu-out)")
    ap.add_argument("--stages", default=None, help="comma-separated stage names (default: every default stage)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="seconds for this call; stages are capped by it")
    ap.add_argument("--redo", action="store_true", help="run named stages again even if done")
    ap.add_argument("--smoke", action="store_true", help="every stage's CPU twin (its code path, in seconds)")
    ap.add_argument("--bundle", type=Path, default=None, help="pack --out into this .tgz after every stage")
    ap.add_argument("--list", action="store_true", help="list the stages and exit")
    ap.add_argument(
        "--detach", action="store_true", help="run in a session of its own and return at once (long stages)"
    )
    ap.add_argument("--wait", type=float, default=None, metavar="S", help="wait up to S s for a detached runner")
    args = ap.parse_args(argv)
    if args.wait is not None:
        return wait_detached(args.out, args.wait, args.bundle)
    if args.detach:
        return detach(args.out, [a for a in argv if a != "--detach"])
    if args.list:
        for s in STAGES:
            print(f"{s.name:<{NAME_WIDTH}} {s.timeout_s:>4} s  {s.gpus} GPU  {s.what}")
        return 0
    names = [n.strip() for n in args.stages.split(",")] if args.stages else [s.name for s in STAGES if s.default]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"--stages: unknown {unknown}; known: {', '.join(BY_NAME)}")
    gpus = gpu_count()
    if not args.smoke and gpus == 0:
        print("bench.gpu: no CUDA device here; nothing to run (--smoke runs every stage's CPU twin)")
        return 0
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    state = load_state(out)
    t0 = time.monotonic()
    for name in names:
        stage = BY_NAME[name]
        done = state.get(name, {})
        if done.get("rc") == 0 and done.get("smoke") == args.smoke and not args.redo:
            print(f"=== {name}: done in an earlier call ({done.get('seconds')} s); --redo to run it again", flush=True)
            continue
        if args.smoke and stage.smoke is None:
            why = "needs several GPUs" if stage.gpus > 1 else "GPU only: it measures what the GPU does"
            state[name] = {"skipped": f"no CPU twin ({why})", "smoke": True}
            continue
        if stage.long and not args.smoke and not os.environ.get("COLO_FSM_GPU_DETACHED"):
            state[name] = {"skipped": "longer than one remote call: start it with --detach, follow it with --wait"}
            print(f"=== {name}: skipped ({state[name]['skipped']})", flush=True)
            continue
        if not args.smoke and stage.gpus > gpus:
            state[name] = {"skipped": f"needs {stage.gpus} GPUs, this machine has {gpus}"}
            print(f"=== {name}: skipped ({state[name]['skipped']})", flush=True)
            continue
        left = args.budget_s - (time.monotonic() - t0)
        if left < MIN_LEFT_S:
            print(f"=== {name}: not started ({left:.0f} s left of the call's budget)", flush=True)
            continue
        timeout = min(stage.timeout_s, left)
        print(f"=== {name} (up to {timeout:.0f} s): {stage.what}", flush=True)
        state[name] = run_stage(stage, out, timeout, smoke=args.smoke)
        save_state(out, state)
        bundle(out, args.bundle)
        o = state[name]
        print(
            f"=== {name}: rc={o['rc']}{' (cut by its timeout)' if o['cut_by_timeout'] else ''} in {o['seconds']} s"
            f"{wholeness(o)}",
            flush=True,
        )
    save_state(out, state)
    bundle(out, args.bundle)
    print()
    print(f"{'stage':<{NAME_WIDTH}} {'rc':>4} {'s':>6}  headline")
    failed = False
    for name in names:
        o = state.get(name, {})
        if "rc" not in o:
            print(f"{name:<{NAME_WIDTH}} {'-':>4} {'-':>6}  {o.get('skipped', 'not run')}")
            continue
        failed |= o["rc"] != 0
        print(f"{name:<{NAME_WIDTH}} {o['rc']:>4} {o['seconds']:>6.0f}  {headline(out, name, o)}")
    return 1 if failed else 0


def detach(out: Path, argv: list[str]) -> int:
    """Start the runner with ``argv`` in a process session of its own (it outlives the command that started it,
    as a remote machine allows while it stays warm); its output goes to ``OUT/runner.log``."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLO_FSM_GPU_DETACHED": "1"}
    with open(out / "runner.log", "a", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [PY, "-m", "bench.gpu", *argv], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    (out / "runner.pid").write_text(str(proc.pid), encoding="utf-8")
    print(f"bench.gpu: runner {proc.pid} detached; follow it with --wait S (log: {out / 'runner.log'})")
    return 0


def wait_detached(out: Path, seconds: float, bundle_to: Path | None) -> int:
    """Wait up to ``seconds`` for the detached runner of ``out``; print its log's tail; 3 while it still runs."""
    pid_file = out / "runner.pid"
    if not pid_file.exists():
        print(f"bench.gpu: no detached runner in {out}")
        return 2
    pid = int(pid_file.read_text(encoding="utf-8"))

    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    deadline = time.monotonic() + seconds
    while alive() and time.monotonic() < deadline:
        time.sleep(2)
    bundle(out, bundle_to)
    log = out / "runner.log"
    if log.exists():
        print("\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]))
    running = alive()
    print(f"bench.gpu: runner {pid} {'still running' if running else 'finished'}")
    return 3 if running else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.gpu [report] ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from bench.gpu_report import main as report

        return report(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
