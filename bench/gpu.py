"""All of colo-fsm's GPU evidence, one command: named stages, each with a time budget, resumable across calls.

    python -m bench.gpu --list                                  # the stages, what each measures, its budget
    python -m bench.gpu --out gpu-out --budget-s 540            # every single-GPU stage not done yet, in order
    python -m bench.gpu --out gpu-out --stages reasoning-8k-park-abort,tests --bundle $OUT/gpu-out.tgz
    python -m bench.gpu --smoke --out /tmp/gpu-smoke            # every stage's CPU twin, in seconds each
    python -m bench.gpu report docs/gpu-runs --out docs/gpu-runs/PERFORMANCE.md   # (CPU) the docs' tables (--plot, --notes)

A stage is named for what it measures (:data:`STAGES`); it runs as a child process under its own timeout, capped
by what is left of ``--budget-s``; a stage that cannot finish in what is left is skipped (and said so), and one
that needs more GPUs than the machine has is skipped with that reason. Each stage writes its JSON as it goes,
so a stage cut by its timeout keeps what it measured. ``OUT/stages.json`` records every stage's outcome: a later
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PY = sys.executable
HANDOFF = ("bench/inflight_handoff.py", "--workload", "reasoning")
SMOKE_HANDOFF = ("--smoke", "--model", "small", "--max-len", "48")  # later options win: the CPU shape


@dataclass(frozen=True)
class Stage:
    """One piece of GPU evidence: the command (``{out}`` is the stage's output folder), its budget, its needs."""

    name: str
    what: str
    argv: tuple[str, ...]
    timeout_s: int
    gpus: int = 1
    smoke: tuple[str, ...] | None = None  # extra arguments that make the same code path run on the CPU in seconds
    default: bool = True  # run when no --stages are named (multi-GPU stages run only where the GPUs are)
    long: bool = False  # needs more than one 10-minute remote call: run it with --detach, then --wait

    def command(self, out: Path, *, smoke: bool = False) -> list[str]:
        """The argv to run, with ``{out}`` filled in (and the smoke arguments appended for ``smoke``)."""
        argv = [a.replace("{out}", str(out)) for a in self.argv]
        if argv[0].endswith(".py") or argv[0] in ("-m", "-c"):
            argv = [PY, *argv]
        return argv + list(self.smoke or ()) if smoke else argv


def _handoff(
    cut: int,
    modes: str,
    *extra: str,
    model: str = "gpt200m",
    age: int = 2,
    order: str = "start",
    steps: int = 3,
    engine: str = "direct",
) -> tuple[str, ...]:
    tail = ("" if order == "start" else f"_{order}-order") + ("" if engine == "direct" else f"_{engine}")
    name = f"inflight_handoff_reasoning_{model}_cut{cut}_age{age}_{modes.replace(',', '-')}{tail}.json"
    return (
        *HANDOFF,
        "--buffer-order",
        order,
        "--model",
        model,
        "--max-len",
        str(cut),
        "--max-age",
        str(age),
        "--modes",
        modes,
        "--steps",
        str(steps),
        *extra,
        "--out",
        f"{{out}}/{name}",
    )


def _detached(
    name: str, what: str, argv: tuple[str, ...], timeout_s: int, smoke: tuple[str, ...] = SMOKE_HANDOFF
) -> Stage:
    """A handoff stage longer than one 10-minute remote call: run only when named, with --detach, then --wait."""
    return Stage(name, what, argv, timeout_s, smoke=smoke, default=False, long=True)


STAGES: tuple[Stage, ...] = (
    Stage(
        "tests",
        "pytest -m gpu: the dynamic engine (suspend/resume, park and abort in every KV mode), the trainer (DDP hooks, "
        "schedule loss, optimizer and distributed-optimizer checkpoints), megatron's coordinator loop (park, abort, "
        "MoE, the OpenAI server over it)",
        (
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--timeout",
            "150",
            "tests/test_megatron_engine.py",
            "tests/test_megatron_trainer_gpu.py",
            "tests/test_megatron_model.py",
            "tests/test_megatron_coordinator_gpu.py",
            "--junitxml",
            "{out}/pytest_gpu.xml",
        ),
        360,
        smoke=("--collect-only",),
    ),
    _detached(
        "reasoning-8k",
        "reasoning shape, cut 8,192: park, drain, sync and abort on one engine built once (each after its warm-up), "
        "and the pure graph decode; ~16 min: --detach",
        _handoff(8192, "park,drain,sync,abort"),
        1500,
    ),
    Stage(
        "reasoning-8k-park-abort",
        "reasoning shape, cut 8,192: park against the peers' abort-and-resubmit, side by side on one engine",
        _handoff(8192, "park,abort", "--no-graph-baseline"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    Stage(
        "reasoning-8k-park-drain",
        "reasoning shape, cut 8,192: park and drain side by side (each after its warm-up), and the pure graph decode",
        _handoff(8192, "park,drain"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    _detached(
        "reasoning-8k-drain-hold",
        "reasoning shape, cut 8,192: park, drain and drain-hold (drain whose collector starts nothing while the next "
        "batch is ready, so the trainer's handoff wins its race with the collector; bench/handoff_model.py predicts "
        "park/drain-hold 1.11-1.17); ~14 min: --detach",
        _handoff(8192, "park,drain,drain-hold", "--no-graph-baseline"),
        1200,
    ),
    Stage(
        "reasoning-8k-park-drain-hold",
        "reasoning shape, cut 8,192: park and drain-hold only (drain's own runs are the earlier ones), side by side "
        "on one engine; the short form of reasoning-8k-drain-hold",
        _handoff(8192, "park,drain-hold", "--no-graph-baseline"),
        600,
        smoke=SMOKE_HANDOFF,
        default=False,
    ),
    _detached(
        "reasoning-8k-coordinator",
        "reasoning shape, cut 8,192, on megatron-core's coordinator loop (the faster path for park: 1.11x the direct "
        "one at aaf3a49): the pure graph decode, then park, drain, sync and abort on one engine, the headline's modes "
        "and park's decode against the graph decode in one process, on the path users run; ~15 min (the four modes "
        "took 759 s at 4366d6d): --detach",
        _handoff(8192, "park,drain,sync,abort", "--engine", "coordinator", engine="coordinator"),
        1500,
        smoke=(*SMOKE_HANDOFF, "--engine", "direct"),  # the coordinator needs a GPU; the rest of the path runs
    ),
    Stage(
        "reasoning-8k-drain-sync",
        "reasoning shape, cut 8,192: drain and sync again (a second run of each beside an earlier park, for their "
        "spread), and the pure graph decode at the workload's contexts",
        _handoff(8192, "drain,sync"),
        600,
        smoke=SMOKE_HANDOFF,
        default=False,
    ),
    Stage(
        "reasoning-8k-park-sync",
        "reasoning shape, cut 8,192: park and sync side by side (generate the whole batch, tail included, then train)",
        _handoff(8192, "park,sync", "--no-graph-baseline"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    _detached(
        "reasoning-32k",
        "reasoning shape, cut 32,768: park, drain and sync (where drain's tail grows); ~16 min: --detach",
        _handoff(32768, "park,drain,sync", "--no-graph-baseline"),
        2400,
    ),
    _detached(
        "reasoning-32k-park-sync",
        "reasoning shape, cut 32,768: park and sync only (drain's figure is the long one); ~10 min: --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline"),
        1200,
    ),
    Stage(
        "reasoning-8k-deadline",
        "park (buffer in deadline order: no head-of-line blocking) and sync at cut 8,192",
        _handoff(8192, "park,sync", "--no-graph-baseline", order="deadline"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    _detached(
        "reasoning-32k-deadline",
        "park (buffer in deadline order) and sync at cut 32,768, where a long rollout at the head holds a step; "
        "~9 min: --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline", order="deadline"),
        1200,
    ),
    _detached(
        "reasoning-8k-age1",
        "park and drain at --max-age 1 (one step of staleness allowed); ~8 min (488 s at 6f74238), too close to one "
        "remote call with the wheels' install: --detach",
        _handoff(8192, "park,drain", "--no-graph-baseline", age=1),
        900,
    ),
    _detached(
        "reasoning-8k-age4",
        "park and drain at --max-age 4: 4 warm-up steps, 6 measured (bench/handoff_model.py: after one, park's "
        "3-step window makes 42% fewer samples than it trains; 4 + 6 is steady for each of 4 seeds); ~15 min: --detach",
        _handoff(8192, "park,drain", "--no-graph-baseline", "--warmup", "4", age=4, steps=6),
        1500,
    ),
    _detached(
        "reasoning-32k-age4",
        "park and sync at cut 32,768 with --max-age 4: a wider admission window, so more of it decodes at long "
        "tails; 4 warm-up steps, 6 measured (bench/handoff_model.py: steady for 3 of 4 seeds, the bench's among "
        "them); ~15 min: --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline", "--warmup", "4", age=4, steps=6),
        1500,
    ),
    _detached(
        "reasoning-8k-gpt1b",
        "the ~1B GPT: park and sync at cut 8,192; ~9 min (533 s at 6f74238), too close to one remote call with the "
        "wheels' install: --detach",
        _handoff(8192, "park,sync", "--no-graph-baseline", model="gpt1b"),
        1200,
    ),
    Stage(
        "engine-paths",
        "park on colo-fsm's direct engine against megatron-core's own engine loop (coordinator mode), reasoning shape",
        (
            "bench/engine_paths.py",
            "--workload",
            "reasoning",
            "--modes",
            "park",
            "--steps",
            "3",
            "--no-graph-baseline",
            "--out",
            "{out}/engine_paths_reasoning_cut8192.json",
        ),
        600,
        smoke=(*SMOKE_HANDOFF, "--engines", "direct"),
    ),
    Stage(
        "engine-loop",
        "the direct engine loop's own host cost per decode step at 64 and 256 active requests (no model)",
        ("bench/engine_loop.py", "--out", "{out}/engine_loop.json"),
        60,
        smoke=("--quick",),
    ),
    Stage(
        "graphs",
        "CUDA-graph decode against eager on one trainable model; greedy equality before and after training",
        ("bench/cuda_graph_decode.py", "--out", "{out}/cuda_graph_decode.json"),
        300,
        smoke=("--device", "cpu", "--quick"),
    ),
    Stage(
        "park-probe",
        "requests parked across suspend -> train -> resume through the adapter, in every KV mode",
        ("bench/park_probe.py", "--out", "{out}/park_probe.json"),
        180,
        smoke=("--device", "cpu"),
    ),
    Stage(
        "colocated-vs-dedicated",
        "decode on the colocated trainable model against a dedicated inference-only model",
        ("bench/colocated_vs_dedicated.py", "--timeout", "78", "--out", "{out}/colocated_vs_dedicated.json"),
        180,
    ),
    Stage(
        "resident-vs-rebuild",
        "a resident engine's resume against a rebuild (with and without CUDA graphs)",
        (
            "bench/resident_vs_rebuild.py",
            "--graph-cycles",
            "2",
            "--graph-rebuilds",
            "1",
            "--out",
            "{out}/resident_vs_rebuild.json",
        ),
        200,
    ),
    Stage(
        "memory-peak",
        "the trainer's peak memory beside a resident KV buffer, against the memory-budget estimate",
        ("bench/memory_peak.py", "--graphs", "off", "--buffer-gb", "8", "--out", "{out}/memory_peak.json"),
        90,
    ),
    Stage(
        "fingerprint-nccl",
        "the fingerprint barrier against a plain barrier over NCCL (world of one)",
        (
            "bench/fingerprint_barrier.py",
            "--backend",
            "nccl",
            "--ranks",
            "1",
            "--quick",
            "--json",
            "{out}/fingerprint_barrier_nccl.json",
        ),
        90,
        smoke=("--backend", "gloo", "--ranks", "2"),
    ),
    Stage(
        "adapter-1gpu",
        "the megatron-core adapter end to end on one GPU: KV modes, suspend/resume timings, train, checkpoint",
        ("scripts/gpu_megatron_check.py", "--out", "{out}/adapter_1gpu"),
        240,
        smoke=("--device", "cpu"),
    ),
    Stage(
        "demo-cuda",
        "the demo on CUDA: 60 steps with validation and checkpoints",
        (
            "-m",
            "colo_fsm.demo",
            "--device",
            "cuda",
            "--steps",
            "60",
            "--validate-every",
            "20",
            "--checkpoint-every",
            "30",
            "--no-tensorboard",
            "--run-dir",
            "{out}/demo_run",
        ),
        180,
        smoke=("--device", "cpu", "--steps", "6"),
    ),
    Stage(
        "adapter-tp2",
        "the adapter over 2 GPUs at TP=2 (NCCL)",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_megatron_check.py", "--tp", "2", "--out", "{out}/tp2"),
        240,
        gpus=2,
    ),
    Stage(
        "adapter-dp2",
        "the adapter over 2 GPUs at DP=2 (NCCL)",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_megatron_check.py", "--tp", "1", "--out", "{out}/dp2"),
        200,
        gpus=2,
    ),
    Stage(
        "coordinator-ep2",
        "megatron's coordinator loop with expert parallelism over 2 GPUs (MoE)",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_coordinator_multi.py", "--ep", "2"),
        240,
        gpus=2,
    ),
    Stage(
        "coordinator-tp2",
        "megatron's coordinator loop at TP=2 over 2 GPUs",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_coordinator_multi.py", "--tp", "2"),
        240,
        gpus=2,
    ),
)
BY_NAME = {s.name: s for s in STAGES}
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


def run_stage(stage: Stage, out: Path, timeout_s: float, *, smoke: bool) -> dict[str, Any]:
    """Run one stage as a child process (its own folder, its own log); returns its outcome."""
    folder = out / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    cmd = stage.command(folder, smoke=smoke)
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
    return {
        "rc": rc,
        "cut_by_timeout": cut,
        "seconds": round(time.monotonic() - t0, 1),
        "timeout_s": round(timeout_s),
        "command": " ".join(cmd),
        "smoke": smoke,
        "outputs": sorted(str(p.relative_to(out)) for p in folder.rglob("*.json")),
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
            print(f"{s.name:<30} {s.timeout_s:>4} s  {s.gpus} GPU  {s.what}")
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
            state[name] = {"skipped": "no CPU twin (needs several GPUs)", "smoke": True}
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
            f"=== {name}: rc={o['rc']}{' (cut by its timeout)' if o['cut_by_timeout'] else ''} in {o['seconds']} s",
            flush=True,
        )
    save_state(out, state)
    bundle(out, args.bundle)
    print()
    print(f"{'stage':<30} {'rc':>4} {'s':>6}  headline")
    failed = False
    for name in names:
        o = state.get(name, {})
        if "rc" not in o:
            print(f"{name:<30} {'-':>4} {'-':>6}  {o.get('skipped', 'not run')}")
            continue
        failed |= o["rc"] != 0
        print(f"{name:<30} {o['rc']:>4} {o['seconds']:>6.0f}  {headline(out, name, o)}")
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
