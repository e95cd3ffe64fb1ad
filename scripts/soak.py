"""Soak the colocated handoff: N suspend -> train -> resume cycles through the real lifecycle, under torchrun.

Every rank runs one :class:`~colo_fsm.machine.lifecycle.Lifecycle` over the megatron adapter's
:class:`~colo_fsm.adapters.megatron.engine.MegatronEngine` (continuous batching, ``inflight="park"``) and
:class:`~colo_fsm.adapters.megatron.trainer.MegatronTrainer` on one shared megatron-core GPT, with the
fingerprint barrier (:class:`~colo_fsm.guards.barrier.TorchBarrier`) at every handoff and a checkpoint through
the adapter every ``--save-every`` cycles. A background submitter keeps ``--inflight`` requests in the engine
at all times, so every handoff parks some.

Hangs are data, not a crash: the process group timeout (``--nccl-timeout-s``) bounds every collective, and a
watchdog thread bounds each cycle's wall time (``--cycle-limit-s``); when it fires, the rank dumps its stacks,
writes its record and exits 3. Each rank writes ``<out>.rank<R>.json`` after every cycle; rank 0 merges them
into ``--out`` (a ``figures`` object and per-cycle timing summaries).

Faults on purpose:

* ``--misorder resume-before-barrier``: the wake edge signals ``resume_engine`` before the drain and the
  barrier (a spec edit; the static validator refuses it, so the lifecycle is built with ``check_spec=False``
  and the run shows what the runtime does);
* ``--misorder wrong-device-drain``: each rank drains its neighbour's GPU (``DeviceDrain(local_rank=(LOCAL_RANK
  + 1) % n)``), not its own (CUDA only: on the CPU there is no device to get wrong);
* ``--diverge-mode-rank R`` (with ``--diverge-at-cycle C``): at cycle C rank R's suspend leaves megatron-core's
  ``InferenceMode`` flag set; the fingerprint barrier must name the divergence on every rank
  (:class:`~colo_fsm.errors.HandoffDivergence`) before any collective timeout.

CPU (gloo) stand-in::

    torchrun --nproc-per-node 2 scripts/soak.py --backend gloo --device cpu --tp 2 --cycles 20 --save-every 5

GPU commands: docs/gpu-runs/SOAK.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TIMED = ("handoff_ms", "to_training_ms", "barrier_ms", "suspend_ms", "resume_ms", "train_ms", "save_ms",
         "train_and_back_ms")  # fmt: skip
MISORDERS = ("none", "resume-before-barrier", "wrong-device-drain")
HANDOFF_ACTIONS = (  # the handoff proper: everything a cycle does except the training step and the save
    "latch_step_decisions",
    "pause_collector",
    "suspend_engine",
    "drain_device",
    "barrier",
    "restore_training_buffers",
    "bump_weight_version",
    "offload_training_buffers",
    "resume_engine",
    "resume_collector",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=500, help="suspend -> train -> resume cycles (training steps)")
    ap.add_argument("--save-every", type=int, default=25, help="checkpoint every N cycles (0: never)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (the rest of the world is DP)")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    ap.add_argument("--misorder", choices=MISORDERS, default="none")
    ap.add_argument("--diverge-mode-rank", type=int, default=None, help="rank whose suspend leaves InferenceMode set")
    ap.add_argument("--diverge-at-cycle", type=int, default=3, help="cycle at which that rank diverges")
    ap.add_argument("--barrier", choices=("fingerprint", "plain"), default="fingerprint",
                    help="plain: the handoff barrier exchanges no fingerprint (what a divergence does without it)")  # fmt: skip
    ap.add_argument("--nccl-timeout-s", type=float, default=60.0, help="process-group and barrier timeout")
    ap.add_argument("--cycle-limit-s", type=float, default=None, help="watchdog per cycle (default: 2x timeout)")
    ap.add_argument("--inflight", type=int, default=8, help="requests the submitter keeps in the engine")
    ap.add_argument("--max-tokens", type=int, default=24, help="longest request (lengths are heavy-tailed)")
    ap.add_argument("--batch", type=int, default=8, help="rollouts per training step")
    ap.add_argument("--kv-cache-mode", default="persist", choices=("persist", "offload", "recompute"))
    ap.add_argument("--cuda-graphs", action="store_true", help="ModelConfig(cuda_graphs=True) (CUDA only)")
    ap.add_argument("--num-cuda-graphs", type=int, default=None, help="GenerationConfig(num_cuda_graphs=...)")
    ap.add_argument(
        "--no-tp-lockstep", action="store_true", help="GenerationConfig(tp_lockstep=False): shows the desync"
    )
    ap.add_argument("--hidden", type=int, default=None, help="default: 32 on cpu, 512 on cuda")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=None, help="default: 4 on cpu, 8 on cuda")
    ap.add_argument("--seq", type=int, default=None, help="max sequence length (default: 48 cpu, 256 cuda)")
    ap.add_argument("--gen-ms", type=float, default=20.0, help="generation time between two handoffs (ms)")
    ap.add_argument("--barrier-bench", type=int, default=200, help="fingerprint vs plain barrier rounds (0: skip)")
    ap.add_argument(
        "--work-dir", default=None, help="rank files, stacks, checkpoints (default: /tmp/colo-fsm-soak/<out stem>)"
    )
    ap.add_argument(
        "--out",
        default=None,
        help="the merged JSON (default: docs/gpu-runs/<date>-<cpu-soak-gloo|h200-soak>-x<world><variant>.json)",
    )
    ap.add_argument("--note", default="", help="free text stored in the JSON")
    ap.add_argument("--merge-only", type=int, default=None, metavar="WORLD",
                    help="only merge the rank files of an earlier run of WORLD ranks (same --out / --work-dir)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    if args.backend == "nccl" and args.device != "cuda":
        ap.error("--backend nccl needs --device cuda")
    if args.cycles < 1 or args.save_every < 0 or args.inflight < 0 or args.batch < 1:
        ap.error("--cycles >= 1, --save-every >= 0, --inflight >= 0, --batch >= 1")
    if args.out is None:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        kind = f"cpu-soak-{args.backend}" if args.device == "cpu" else "h200-soak"
        variant = f"-tp{args.tp}-dp{world // args.tp}" if args.tp != world else ""
        variant += f"-{args.misorder}" if args.misorder != "none" else ""
        variant += f"-diverge-r{args.diverge_mode_rank}" if args.diverge_mode_rank is not None else ""
        variant += "-no-tp-lockstep" if args.no_tp_lockstep else ""
        variant += "-plain-barrier" if args.barrier == "plain" else ""
        date = datetime.now(UTC).strftime("%Y-%m-%d")
        args.out = str(ROOT / "docs" / "gpu-runs" / f"{date}-{kind}-x{world}{variant}.json")
    if args.cycle_limit_s is None:
        args.cycle_limit_s = 2.0 * args.nccl_timeout_s
    if args.misorder == "wrong-device-drain" and args.device != "cuda":
        args.wrong_drain_note = "not applicable on the CPU: there is no device to drain wrongly (NoDeviceDrain)"
    return args


# ---------------------------------------------------------------------------------------------- watchdog
class Watchdog:
    """Bounds each cycle's wall time: past the limit it calls ``on_hang`` (which writes data and exits)."""

    def __init__(self, limit_s: float, on_hang: Callable[[str, float], None]) -> None:
        self.limit_s = limit_s
        self.on_hang = on_hang
        self._lock = threading.Lock()
        self._label: str | None = None
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str) -> None:
        with self._lock:
            self._label, self._t0 = label, time.monotonic()

    def disarm(self) -> None:
        with self._lock:
            self._label = None

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                label, t0 = self._label, self._t0
            if label is not None and time.monotonic() - t0 > self.limit_s:
                self.on_hang(label, time.monotonic() - t0)
                return


# ---------------------------------------------------------------------------------------------- submitter
class Submitter:
    """Keeps ``target`` requests in the engine (queued, running or parked) from a background thread.

    Requests are a deterministic sequence (prompt, heavy-tailed length and seed by index), so every rank of a
    tensor-parallel group submits the same ones in the same order.
    """

    def __init__(self, engine: Any, tok: Any, *, target: int, max_tokens: int, seed: int) -> None:
        self.engine = engine
        self.tok = tok
        self.target = target
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        self.submitted = 0
        self.completed = 0
        self.aborted = 0
        self.failed = 0
        self.spanning = 0  # completions whose tokens span more than one weight version
        self.max_version_span = 0
        self.errors: list[str] = []
        self._live: set[Any] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-submitter", daemon=True)

    def start(self) -> None:
        if self.target > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._live)

    def _request(self, i: int) -> tuple[list[int], int]:
        prompt = f"{i % 97}+{(7 * i) % 89}="
        # heavy tail: most requests short, some run to max_tokens (so some stay parked across several handoffs)
        n = min(self.max_tokens, max(1, int(self.rng.lognormvariate(1.6, 0.9))))
        return self.tok.tokenize(prompt), n

    def _done(self, handle: Any) -> Callable[[Any], None]:
        def cb(fut: Any) -> None:
            with self._lock:
                self._live.discard(handle)
                try:
                    c = fut.result()
                except BaseException as exc:  # counted, never lost
                    self.failed += 1
                    if len(self.errors) < 5:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    return
                if c.finish_reason == "abort":
                    self.aborted += 1
                    return
                self.completed += 1
                vs = c.weight_versions
                if vs and vs[-1] != vs[0]:
                    self.spanning += 1
                    self.max_version_span = max(self.max_version_span, vs[-1] - vs[0])

        return cb

    def _run(self) -> None:
        from colo_fsm.errors import EngineStopped

        while not self._stop.is_set():
            with self._lock:
                need = self.target - len(self._live)
            for _ in range(max(0, need)):
                prompt, n = self._request(self.submitted)
                try:
                    h = self.engine.submit(prompt, max_tokens=n, temperature=0.0)
                except EngineStopped:
                    return
                with self._lock:
                    self._live.add(h)
                    self.submitted += 1
                h.future.add_done_callback(self._done(h))
            self._stop.wait(0.002)


# ---------------------------------------------------------------------------------------------- helpers
def summary(xs: list[float]) -> dict[str, float] | None:
    """p50 / p90 / p99 / max / mean of ``xs`` (milliseconds in, milliseconds out)."""
    if not xs:
        return None
    s = sorted(xs)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))], 3)

    return {"n": len(s), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(s[-1], 3),
            "mean": round(statistics.fmean(s), 3)}  # fmt: skip


def misordered_spec(kind: str) -> Any:
    """The lifecycle spec with the wake edge signalling ``resume_engine`` before the drain and the barrier."""
    from colo_fsm.states.spec import LIFECYCLE, State

    def edit(spec: Any, trigger: str, src: State, dst: State, **changes: Any) -> Any:
        ts = tuple(
            dataclasses.replace(t, **changes) if (t.trigger, t.source, t.dest) == (trigger, src, dst) else t
            for t in spec.transitions
        )
        return dataclasses.replace(spec, transitions=ts)

    assert kind == "resume-before-barrier"
    spec = edit(LIFECYCLE, "conclude", State.TRAINING, State.WAKING, actions=("offload_training_buffers",))
    return edit(spec, "resume", State.WAKING, State.GENERATING, when=(),
                actions=("resume_engine", "drain_device", "barrier", "resume_collector"))  # fmt: skip


def training_batch(tok: Any, cycle: int, n: int) -> list[Any]:
    """A deterministic batch for ``cycle`` (identical on every rank: tensor-parallel peers run the same shapes)."""
    from colo_fsm.adapters.megatron.trainer import Rollout

    out = []
    for i in range(n):
        a, b = (cycle * 7 + i) % 50, (cycle * 3 + 2 * i) % 50
        prompt = tok.tokenize(f"{a}+{b}=")
        completion = tok.tokenize(str(a + b if i % 2 == 0 else a + b + 1))
        out.append(Rollout(tuple(prompt), tuple(completion), float(i % 2 == 0), i // 4))
    return out


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- the soak
def run(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = work_dir(args, out)
    work.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # peers cannot save before the process group exists, which needs rank 0
        import shutil

        shutil.rmtree(work / "ckpt", ignore_errors=True)
    rank_path = work / f"rank{rank}.json"
    stacks_path = work / f"rank{rank}.stacks.txt"
    rec: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "status": "starting",
        "cycles_done": 0,
        "hang": None,
        "divergence": None,
        "failure": None,
        "cycles": [],
    }
    save = lambda: write_json(rank_path, rec)  # noqa: E731

    def on_hang(label: str, waited: float) -> None:
        with stacks_path.open("w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        rec["hang"] = {"where": label, "waited_s": round(waited, 1), "stacks": str(stacks_path)}
        rec["status"] = "hang"
        save()
        try:  # any stuck rank merges (torchrun ends its peers when it exits): the record exists regardless
            merge(args, out, world, wait_s=2.0)
        except Exception:
            traceback.print_exc()
        os._exit(3)

    def on_term(signum: int, _frame: Any) -> None:  # torchrun ends the peers of a rank that exited
        rec["status"] = rec["status"] if rec["status"] in ("hang", "diverged", "failed") else f"signal {signum}"
        save()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    watchdog = Watchdog(args.cycle_limit_s, on_hang)
    watchdog.arm("startup")

    import logging

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.inference.utils import InferenceMode

    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model
    from colo_fsm.adapters.megatron.parallel import init_distributed
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig
    from colo_fsm.errors import HandoffDivergence, LifecycleError
    from colo_fsm.guards.barrier import TorchBarrier
    from colo_fsm.guards.decision import CheckpointDecision
    from colo_fsm.guards.drain import DeviceDrain, NoDeviceDrain
    from colo_fsm.guards.fingerprint import HandoffFingerprint
    from colo_fsm.guards.mode import mode_digest, report_of
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
    from colo_fsm.states.spec import State

    logging.basicConfig(level=logging.WARNING, format=f"[rank{rank}] %(name)s %(levelname)s %(message)s")
    for noisy in ("megatron", "torch", "py.warnings", "transitions", "colo_fsm"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    cuda = args.device == "cuda"
    setup = init_distributed(args.tp, device=args.device, timeout_s=args.nccl_timeout_s)
    rec["setup"] = dataclasses.asdict(setup)
    tok = CharTokenizer()
    mcfg = ModelConfig(
        vocab_size=64,  # the tokenizer's 53 ids, padded to a multiple of every TP size used
        hidden_size=args.hidden or (512 if cuda else 32),
        num_layers=args.layers,
        num_attention_heads=args.heads or (8 if cuda else 4),
        max_sequence_length=args.seq or (256 if cuda else 48),
        device=args.device,
        tensor_model_parallel_size=args.tp,
        cuda_graphs=bool(args.cuda_graphs),
    )
    model = build_model(mcfg)
    ckpt_dir = work / "ckpt"
    trainer = MegatronTrainer(
        model, TrainerConfig(lr=1e-3, checkpoint_dir=str(ckpt_dir), offload_optimizer_state=cuda), pad_id=tok.pad
    )
    lc_box: list[Any] = []
    engine = MegatronEngine(
        model,
        tok,
        GenerationConfig(
            kv_cache_mode=args.kv_cache_mode,
            inflight="park",
            max_active_requests=max(1, args.inflight),
            num_cuda_graphs=args.num_cuda_graphs,
            backend="auto" if cuda else "cpu",
            tp_lockstep=not args.no_tp_lockstep,
        ),
        max_sequence_length=mcfg.max_sequence_length,
        weight_version=lambda: lc_box[0].weight_version if lc_box else 0,
    )
    rec["engine_backend"] = engine.backend_name

    # --- faults on purpose -----------------------------------------------------------------------------
    cycle_now = [-1]
    diverged_here = args.diverge_mode_rank is not None and rank == args.diverge_mode_rank
    real_suspend = engine.suspend

    def suspend_leaving_inference_mode() -> None:
        real_suspend()
        if cycle_now[0] == args.diverge_at_cycle:
            InferenceMode.set_active()  # the flag a decode path left set, on this rank only

    if diverged_here:
        engine.suspend = suspend_leaving_inference_mode  # type: ignore[method-assign]

    if cuda:
        n_dev = torch.cuda.device_count()
        drain: Any = (
            DeviceDrain(local_rank=(local_rank + 1) % n_dev) if args.misorder == "wrong-device-drain" else DeviceDrain()
        )
    else:
        drain = NoDeviceDrain("CPU stand-in")
    spec_kwargs: dict[str, Any] = {}
    if args.misorder == "resume-before-barrier":
        from colo_fsm.states.validate import SpecError, validate_spec

        spec = misordered_spec(args.misorder)
        try:
            validate_spec(spec)
            rec["validator_on_misorder"] = "accepted"
        except SpecError as exc:
            rec["validator_on_misorder"] = f"refused: {str(exc)[:400]}"
        spec_kwargs = {"spec": spec, "check_spec": False}
    barrier = TorchBarrier(timeout_s=args.nccl_timeout_s) if world > 1 else None
    handoff_barrier: Any = barrier
    if barrier is not None and args.barrier == "plain":
        handoff_barrier = PlainBarrier(barrier)
    lc = Lifecycle(
        engine,
        trainer,
        config=LifecycleConfig(num_steps=args.cycles, rank=rank, world_size=world),
        drain=drain,
        barrier=handoff_barrier,
        checkpoint=CheckpointDecision(args.save_every) if args.save_every else None,
        # the lifecycle refuses a checkpoint_extra it would never call: only a run that saves passes one
        checkpoint_extra=(lambda: {"soak": {"rank": rank}}) if args.save_every else None,
        **spec_kwargs,
    )
    lc_box.append(lc)
    sub = Submitter(engine, tok, target=args.inflight, max_tokens=args.max_tokens, seed=1000 + setup.rank // args.tp)

    t_run = time.perf_counter()
    rec["status"] = "running"
    save()
    try:
        lc.start()
        sub.start()
        while not lc.finished:
            i = lc.step_index
            cycle_now[0] = i
            watchdog.arm(f"cycle {i}")
            batch = training_batch(tok, i, args.batch)
            # let the engine decode a little between handoffs (requests get admitted, some finish)
            time.sleep(args.gen_ms / 1e3)
            n_rec = len(lc.trace.records)
            t0 = time.perf_counter()
            lc.begin_step()
            parked = engine.request_counts()
            t1 = time.perf_counter()
            lc.train(batch)
            t2 = time.perf_counter()
            acts: dict[str, float] = {}
            for r in lc.trace.records[n_rec:]:
                for a, s in (r.actions or {}).items():
                    acts[a] = acts.get(a, 0.0) + s
            rec["cycles"].append(
                {
                    "cycle": i,
                    "parked": parked.parked,
                    "queued": parked.queued,
                    "to_training_ms": round(1e3 * (t1 - t0), 3),
                    "train_and_back_ms": round(1e3 * (t2 - t1), 3),
                    "handoff_ms": round(1e3 * sum(acts.get(a, 0.0) for a in HANDOFF_ACTIONS), 3),
                    "barrier_ms": round(1e3 * acts.get("barrier", 0.0), 3),
                    "suspend_ms": round(1e3 * acts.get("suspend_engine", 0.0), 3),
                    "resume_ms": round(1e3 * acts.get("resume_engine", 0.0), 3),
                    "train_ms": round(1e3 * acts.get("train_step", 0.0), 3),
                    "save_ms": round(1e3 * acts["save_checkpoint"], 3) if "save_checkpoint" in acts else None,
                    "state": lc.state.value,
                }
            )
            rec["cycles_done"] = i + 1
            watchdog.disarm()
            save()
        rec["status"] = "done"
    except HandoffDivergence as exc:
        watchdog.disarm()
        rec["status"] = "diverged"
        rec["divergence"] = {
            "cycle": cycle_now[0],
            "raised_after_s_in_cycle": round(time.perf_counter() - t0, 3),
            "before_timeout": time.perf_counter() - t0 < args.nccl_timeout_s,
            "error": type(exc).__name__,
            "message": str(exc)[:1000],
            "fields": {k: {str(v): r for v, r in d.items()} for k, d in exc.fields.items()},
            "mode": {k: {str(v): r for v, r in d.items()} for k, d in exc.mode.items()},
        }
    except LifecycleError as exc:
        watchdog.disarm()
        rec["status"] = "failed"
        cause = exc.__cause__ or exc
        rec["failure"] = {
            "cycle": cycle_now[0],
            "error": type(exc).__name__,
            "cause": f"{type(cause).__name__}: {str(cause)[:600]}",
            "state": lc.state.value,
        }
    finally:
        sub.stop()
    rec["run_s"] = round(time.perf_counter() - t_run, 3)

    # --- stop (teardown aborts whatever is still parked), then account for every request ---------------
    watchdog.arm("stop")
    stop_error = None
    try:
        if lc.state is State.FAILED or lc.finished or lc.can("stop"):
            lc.stop()
    except LifecycleError as exc:
        stop_error = f"{type(exc).__name__}: {exc}"
    time.sleep(0.1)  # futures of aborted requests resolve on the engine thread
    rec["requests"] = {
        "submitted": sub.submitted,
        "completed": sub.completed,
        "aborted_at_shutdown": sub.aborted,
        "failed": sub.failed,
        "unresolved": sub.in_flight(),
        "spanning_rollouts": sub.spanning,
        "max_version_span": sub.max_version_span,
        "errors": sub.errors,
        "engine_steps": engine.steps,
    }
    rec["stop_error"] = stop_error
    rec["final_state"] = lc.state.value
    rec["weight_version"] = lc.weight_version
    watchdog.disarm()

    # --- the fingerprint barrier's cost against a plain barrier, on the same group ----------------------
    if barrier is not None and args.barrier_bench > 0 and rec["status"] == "done":
        watchdog.arm("barrier bench")
        report = report_of(engine)
        fp = HandoffFingerprint("Draining", 1, 1, mode_digest=mode_digest(report), mode=report)
        times: dict[str, list[float]] = {"plain": [], "fingerprint": []}
        for k in range(args.barrier_bench + 10):
            for kind in ("plain", "fingerprint") if k % 2 == 0 else ("fingerprint", "plain"):
                t = time.perf_counter()
                if kind == "plain":
                    barrier.wait(state="Draining", weight_version=1)
                else:
                    barrier.wait(state="Draining", weight_version=1, fingerprint=fp)
                if k >= 10:
                    times[kind].append(1e6 * (time.perf_counter() - t))
        p = statistics.median(times["plain"])
        f = statistics.median(times["fingerprint"])
        rec["barrier_bench"] = {"rounds": args.barrier_bench, "plain_us_p50": round(p, 1),
                                "fingerprint_us_p50": round(f, 1), "fingerprint_over_plain": round(f / p, 3)}  # fmt: skip
        watchdog.disarm()
    save()
    watchdog.close()

    # --- rank 0 merges the rank files (a filesystem merge: it works after a peer died, too) -------------
    if barrier is not None and rec["status"] in ("done", "failed", "diverged"):
        try:
            dist.barrier()
        except Exception:  # a peer that is gone: merge what is there
            pass
    if rank == 0:
        merge(args, out, world)
    try:
        if dist.is_initialized():
            ps.destroy_model_parallel()
            dist.destroy_process_group()
    except Exception:
        pass
    return 0 if rec["status"] in ("done", "diverged", "failed") else 2


def work_dir(args: argparse.Namespace, out: Path) -> Path:
    """Where the ranks write their records, stack dumps and checkpoints (one path for every rank)."""
    return Path(args.work_dir) if getattr(args, "work_dir", None) else Path("/tmp/colo-fsm-soak") / out.stem


class PlainBarrier:
    """The same :class:`~colo_fsm.guards.barrier.TorchBarrier`, exchanging no fingerprint (a plain barrier)."""

    exchanges_fingerprints = False

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def wait(self, *, state: str | None = None, weight_version: int | None = None) -> None:
        self.inner.wait(state=state, weight_version=weight_version)


def merge(args: argparse.Namespace, out: Path, world: int, wait_s: float = 30.0) -> dict[str, Any]:
    """Merge the rank files of the work dir into ``out``: figures, per-rank outcome, per-cycle summaries."""
    ranks: list[dict[str, Any]] = []
    deadline = time.monotonic() + wait_s
    work = work_dir(args, out)
    for r in range(world):
        p = work / f"rank{r}.json"
        while not p.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks.append(json.loads(p.read_text()) if p.exists() else {"rank": r, "status": "no record"})
    # a rank that neither finished, failed nor diverged was stuck (its watchdog or torchrun ended it)
    hangs = sum(1 for r in ranks if r.get("status") not in ("done", "failed", "diverged"))
    diverged = [r for r in ranks if r.get("divergence")]
    failed = [r for r in ranks if r.get("failure")]
    desync = [
        r for r in failed if "Timeout" in str(r["failure"].get("cause", "")) or "BarrierTimeout" in str(r["failure"])
    ]
    cycles_done = min((r.get("cycles_done", 0) for r in ranks), default=0)
    per_cycle = [c for r in ranks for c in r.get("cycles", [])]
    bench = ranks[0].get("barrier_bench") if ranks else None
    expect_div = args.diverge_mode_rank is not None
    figures = {
        "cycles": cycles_done,
        "cycles_requested": args.cycles,
        "checkpoints": sum(1 for c in ranks[0].get("cycles", []) if c.get("save_ms") is not None) if ranks else 0,
        "hangs": hangs,
        "desyncs": len(desync),
        "failures": len(failed),
        "divergence_detected": bool(diverged) and len(diverged) == world,
        "divergence_ranks": [r["rank"] for r in diverged],
        "divergence_before_timeout": all(r["divergence"]["before_timeout"] for r in diverged) if diverged else None,
        "parked_per_handoff_p50": (summary([float(c["parked"]) for c in per_cycle]) or {}).get("p50"),
        "handoffs_with_parked_requests": sum(1 for c in per_cycle if c["parked"] > 0),
        "handoff_ms_p50": (summary([c["handoff_ms"] for c in per_cycle]) or {}).get("p50"),
        "fingerprint_over_plain_barrier": bench["fingerprint_over_plain"] if bench else None,
        "misorder": args.misorder,
        "misorder_result": (
            None
            if args.misorder == "none"
            else failed[0]["failure"]["cause"][:300]
            if failed
            else getattr(args, "wrong_drain_note", None) or "no effect observed: every cycle passed"
        ),
    }
    merged = {
        "what": (
            "CPU stand-in (gloo, tiny model, megatron CPU step loop), NOT the GPU soak"
            if args.device == "cpu"
            else "GPU soak (NCCL, dynamic engine)"
        ),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": f"torchrun --nproc-per-node {world} scripts/soak.py {' '.join(sys.argv[1:])}",
        "note": args.note,
        "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "figures": figures,
        "expected_divergence": expect_div,
        "outcome_ok": (
            hangs == 0
            and not desync
            and (figures["divergence_detected"] if expect_div else True)
            and (len(failed) in (0, world) if args.misorder != "none" else not failed)
        ),
        "timings_ms": {
            k: summary([c[k] for c in per_cycle if c.get(k) is not None])
            for k in (
                "handoff_ms",
                "to_training_ms",
                "barrier_ms",
                "suspend_ms",
                "resume_ms",
                "train_ms",
                "save_ms",
                "train_and_back_ms",
            )
        },
        "ranks": [
            {k: v for k, v in r.items() if k != "cycles"}
            | {"cycles_recorded": len(r.get("cycles", [])), "first_cycles": r.get("cycles", [])[:3]}
            for r in ranks
        ],
    }
    write_json(out, merged)
    print(json.dumps({"out": str(out), "figures": figures, "outcome_ok": merged["outcome_ok"]}), flush=True)
    return merged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge_only is not None:
        merge(args, Path(args.out), args.merge_only, wait_s=0.0)
        return 0
    try:
        return run(args)
    except SystemExit:
        raise
    except BaseException:  # an unexpected crash still leaves its record
        traceback.print_exc()
        return 4


if __name__ == "__main__":
    sys.exit(main())
