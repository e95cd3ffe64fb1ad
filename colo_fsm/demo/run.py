"""The demo loop: asynchronous GRPO on a tiny megatron-core GPT, driven by the colocation lifecycle.

One process per rank (``torch.multiprocessing`` on the CPU with gloo, or one per GPU with NCCL). Each rank
builds the model once, the colocated engine once (kept resident for the whole run), a trainer on the same
model, a replay buffer and a background collector, and lets :class:`~colo_fsm.machine.lifecycle.Lifecycle`
drive them: every step drains, barriers, trains, saves and validates as latched, and hands back.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from colo_fsm.demo.config import DemoConfig
from colo_fsm.errors import ConfigError, RolloutDeferred
from colo_fsm.log import get_logger
from colo_fsm.states.spec import LifecycleSpec

log = get_logger(__name__)

_INFLIGHT_WORDS = {
    "park": "parks the rollouts in flight",
    "drain": "waits for the rollouts in flight",
    "abort": "ends the rollouts in flight and re-prefills them after the step",
}


@dataclass(frozen=True)
class DemoResult:
    """What a finished run reports (rank 0): where it wrote, steps, rewards and timing."""

    run_dir: str
    start_step: int
    end_step: int
    weight_version: int
    first_rewards: float
    last_rewards: float
    val_accuracy: float | None
    consumed_samples: int
    elapsed_s: float
    backend: str
    stopped_by_signal: int | None = None  # SIGTERM / SIGINT asked the run to stop; it stopped cleanly
    checkpoint_step: int | None = None  # the step of the last checkpoint this run saved (None: none)


def default_run_dir(base: str | Path = "runs") -> Path:
    """A fresh timestamped folder under ``base``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(base) / f"demo-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = Path(base) / f"demo-{stamp}-{n}"
    return path


def resolve_run_dir(cfg: DemoConfig) -> Path:
    """The run folder: ``--run-dir``, else for ``--resume`` the newest ./runs folder with a checkpoint, else new."""
    if cfg.run_dir:
        path = Path(cfg.run_dir)
        if cfg.resume and not (path / "checkpoints" / "latest").is_file():
            raise ConfigError(
                "run_dir", cfg.run_dir, "a run folder with checkpoints/latest (from an earlier run) for --resume"
            )
        return path
    if cfg.resume:
        runs = sorted(
            (p for p in Path("runs").glob("demo-*") if (p / "checkpoints" / "latest").is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        if not runs:
            raise ConfigError("run_dir", None, "a run folder with a checkpoint (none under ./runs) for --resume")
        return runs[-1]
    return default_run_dir()


class _NoCudaRuntimeNotice(logging.Filter):
    """Drops torch's ``No CUDA runtime is found, using CUDA_HOME=...`` notice (logged when megatron-core imports
    ``torch.utils.cpp_extension`` on a machine with a CUDA toolkit and no GPU): the demo chose the CPU, so there is
    no runtime to find. Every other record of that logger passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


_CPU_CHOSEN = _NoCudaRuntimeNotice()
CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"
"""The torch logger that logs the notice (a third-party logger the demo filters, not one of colo-fsm's own)."""


def _setup_logging(run_dir: Path, rank: int) -> None:
    """Everything at INFO to run_dir/demo.rank<r>.log; only warnings of colo_fsm on the console."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    fh = logging.FileHandler(run_dir / f"demo.rank{rank}.log")
    fh.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(fh)
    ch = logging.StreamHandler()
    ch.setLevel(logging.WARNING)
    ch.addFilter(lambda r: r.name.startswith("colo_fsm"))
    ch.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(ch)
    logging.captureWarnings(True)
    warnings.simplefilter("default")


def _to_rollouts(groups: Sequence[Any]) -> list[Any]:
    """Trainer rollouts; behaviour log-probs are the engine's per-token record (a group parked through a step
    has tokens of two weight versions, each with the log-prob it was generated with)."""
    from colo_fsm.adapters.megatron.trainer import Rollout

    out = []
    for g in groups:
        prompt_ids = tuple(g.metadata["prompt_ids"])
        lps = g.metadata.get("logprobs") or [[] for _ in g.samples]  # older checkpoints kept them here
        for s, r, lp in zip(g.samples, g.rewards, lps):
            logprobs = tuple(s.logprobs) or tuple(lp)
            out.append(Rollout(prompt_ids, tuple(s.token_ids), float(r), g.prompt_id, logprobs, g.weight_version))
    return out


def run_rank(
    cfg: DemoConfig, run_dir: Path, rank: int = 0, world: int = 1, init_method: str | None = None
) -> DemoResult | None:
    """Run the demo as ``rank`` of ``world``; rank 0 shows progress and returns the result.

    SIGTERM / SIGINT (from the first line on) stop the run at the next step boundary, on every rank at the same
    step; on SIGTERM (unless ``save_on_signal=False``) that step saves a checkpoint and is the run's last.
    """
    from colo_fsm.demo.signals import StopSignals

    signals = StopSignals(escalate=world == 1, rank=rank).install()  # a rank of several: the parent escalates, not us
    try:
        return _run_rank(cfg, run_dir, rank, world, init_method, signals)
    finally:
        signals.close()


def _run_rank(
    cfg: DemoConfig, run_dir: Path, rank: int, world: int, init_method: str | None, signals: Any
) -> DemoResult | None:
    import signal

    if cfg.device == "cpu":  # before megatron-core is imported: its import is what logs the notice
        logging.getLogger(CPP_EXTENSION_LOGGER).addFilter(_CPU_CHOSEN)
    import torch

    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine, to_completion
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model
    from colo_fsm.adapters.megatron.parallel import init_distributed, shutdown_distributed
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig
    from colo_fsm.collector import AsyncCollector, ReplayBuffer, TrajectoryGroup, step_metrics
    from colo_fsm.collector.metrics import StateTimer
    from colo_fsm.demo.progress import ProgressDisplay, follow
    from colo_fsm.demo.signals import StopAgreement
    from colo_fsm.demo.task import ALPHABET, PromptStream, ReverseTask, validation_prompts
    from colo_fsm.guards import CheckpointDecision, InFlightCap, TorchBarrier, ValidationDecision
    from colo_fsm.guards.drain import DeviceDrain, NoDeviceDrain
    from colo_fsm.guards.memory import MemoryBudget
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
    from colo_fsm.metrics import MetricsLogger
    from colo_fsm.states.spec import State

    t_start = time.monotonic()
    _setup_logging(run_dir, rank)
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    if cfg.device == "cuda":
        os.environ.setdefault("LOCAL_RANK", str(rank))
    init_distributed(1, device=cfg.device, rank=rank, world_size=world, init_method=init_method)
    show = rank == 0
    if world > 1:
        import torch.distributed as dist

        stop = StopAgreement(signals, group=dist.new_group(backend="gloo"), world=world)
    else:
        stop = StopAgreement(signals)
    task = ReverseTask(cfg.num_digits)
    tok = CharTokenizer(ALPHABET)
    model = build_model(
        ModelConfig(
            vocab_size=tok.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_attention_heads=cfg.num_attention_heads,
            max_sequence_length=32,
            device=cfg.device,
            seed=cfg.seed,
        )
    )
    ckpt_dir = run_dir / "checkpoints"
    # the importance ratio compares log-probs of the distribution the rollouts were sampled from: the engine
    # records "processed" behaviour log-probs (temperature applied) and the trainer computes them at that temperature
    trainer = MegatronTrainer(
        model, TrainerConfig(lr=cfg.lr, checkpoint_dir=str(ckpt_dir), temperature=cfg.temperature), pad_id=tok.pad
    )
    lc_ref: dict[str, Lifecycle] = {}
    engine = MegatronEngine(
        model,
        tok,
        GenerationConfig(
            kv_cache_mode=cfg.kv_cache_mode,
            inflight=cfg.inflight,
            logprobs_mode="processed",
            server_share=cfg.server_share,
        ),
        weight_version=lambda: lc_ref["lc"].weight_version,
    )
    # the memory guard (on a GPU) estimates the training forward this trainer runs (its token budget per
    # micro-batch) and the optimizer state as this trainer shards it
    engine.memory_budget = MemoryBudget(
        micro_batch_tokens=trainer.config.micro_batch_tokens, optimizer_shards=trainer.optimizer_shards
    )
    buffer = ReplayBuffer(cfg.num_prompts_per_step, cfg.max_trajectory_age_steps)
    start_step = start_version = consumed0 = 0
    elapsed0 = 0.0  # wall-clock seconds of the earlier runs (resume): the metrics' elapsed_s continues
    stream_index = 0
    collector_state: dict[str, Any] | None = None
    if cfg.resume:
        info = trainer.load_checkpoint(ckpt_dir)
        extra = info.extra_state
        buffer.load_state_dict(extra["replay_buffer"])
        stream_index = int(extra["prompt_stream"]["index"])
        collector_state = extra.get("collector")  # prompts drawn but deferred; absent in older checkpoints
        consumed0 = int(extra.get("demo", {}).get("consumed_samples", 0))
        elapsed0 = float(extra.get("demo", {}).get("elapsed_s", 0.0))  # absent in older checkpoints
        start_step, start_version = info.step, info.weight_version
        if start_step >= cfg.steps:
            raise ConfigError("steps", cfg.steps, f"more than the checkpoint's step {start_step} to resume")
    stream = PromptStream(task, seed=cfg.seed * 1000 + rank, index=stream_index)

    # The engine batches every request continuously (rollouts, validation, HTTP). With inflight="park" a
    # handoff stops it at a decode-step boundary: the rollouts in flight stay parked and finish after the step
    # under the new weights (their tokens carry both versions); "drain" waits for them instead. A rollout that
    # has not submitted yet when the collector is paused gives its prompt back (rolled out after the step).
    def rollout(prompt: Any) -> TrajectoryGroup:
        ids = tok.tokenize(prompt.text)
        if collector.should_defer():
            raise RolloutDeferred("the collector is paused for a handoff")
        outs = engine.generate_ids(
            [ids] * cfg.samples_per_group, max_tokens=task.max_tokens, temperature=cfg.temperature
        )
        if any(o.finish_reason == "abort" for o in outs):
            raise RolloutDeferred("the engine was shut down")  # the run is over: not a failure
        answer = tok.tokenize(prompt.metadata["answer"])
        rewards = [task.reward(answer, o.token_ids, tok.eod) for o in outs]
        samples = [to_completion(o) for o in outs]
        return TrajectoryGroup(
            prompt.prompt_id,
            prompt.text,
            tuple(samples),
            tuple(rewards),
            weight_version=min(s.weight_version for s in samples),
            metadata={"prompt_ids": ids},
        )

    val = validation_prompts(task, cfg.val_prompts)

    def validator(step: int, weight_version: int) -> dict[str, float]:
        outs = engine.generate_ids([tok.tokenize(p.text) for p in val], max_tokens=task.max_tokens, temperature=0.0)
        exact = [o.text == p.metadata["answer"] and o.finish_reason == "stop" for o, p in zip(outs, val)]
        rewards = [task.reward(tok.tokenize(p.metadata["answer"]), o.token_ids, tok.eod) for o, p in zip(outs, val)]
        return {"val/accuracy": sum(exact) / len(exact), "val/reward": sum(rewards) / len(rewards)}

    collector = AsyncCollector(
        rollout,
        stream,
        buffer,
        weight_version=lambda: lc_ref["lc"].weight_version,
        cap=InFlightCap(
            cfg.num_prompts_per_step, cfg.max_trajectory_age_steps or 1, samples_per_group=cfg.samples_per_group
        )
        if cfg.max_trajectory_age_steps
        else None,
        admit=lambda: lc_ref["lc"].state is State.GENERATING,
        name=f"collector.rank{rank}",
        inflight=cfg.inflight,
    )
    if collector_state is not None:
        collector.load_state_dict(collector_state)
    metrics: MetricsLogger | None = (
        MetricsLogger(run_dir, tensorboard=cfg.tensorboard, consumed_samples=consumed0, elapsed_offset_s=elapsed0)
        if show
        else None
    )
    t_run = time.monotonic()
    consumed = consumed0
    dp = world

    def checkpoint_extra() -> dict[str, Any]:
        # the save runs inside lc.step, after this step's train_step: count its samples too
        now = consumed + (lc.last_result.consumed_samples * dp if lc.last_result is not None else 0)
        # one snapshot: the buffer's groups, the deferred prompts and the prompts of rollouts parked in the engine
        # (issued again on restore; this live run just finishes them): none lost, none trained on twice
        state = collector.state_dict()
        return {
            "replay_buffer": state.pop("replay_buffer"),
            "prompt_stream": stream.state_dict(),
            "collector": state,  # drawn from the stream, not yet in the buffer: deferred and parked
            "demo": {
                "consumed_samples": now,
                "elapsed_s": metrics.elapsed_s() if metrics is not None else elapsed0 + time.monotonic() - t_run,
            },
        }

    served: Any = engine
    if cfg.serve:
        from colo_fsm.server import GatedEngine, OnPolicy, ServerSettings
        from colo_fsm.server.templates import resolve_chat_template

        # one OpenAI-compatible server per rank, brought up once with the engine (bring_up), on 127.0.0.1;
        # requests it admitted are parked in the engine through a handoff and answered after it
        served = GatedEngine(
            engine,
            engine,
            serve=True,
            host="127.0.0.1",
            model_name="colo-fsm-demo",
            count_tokens=lambda text: len(tok.tokenize(text)),
            tokenizer=tok,
            chat_template=resolve_chat_template(cfg.chat_template),
            inflight=cfg.inflight,  # the engine's own policy: HTTP requests are parked, drained or aborted like rollouts
            settings=ServerSettings(on_policy=OnPolicy(cfg.temperature, 1.0) if cfg.on_policy_guard else None),
        )
    lc = Lifecycle(
        served,
        trainer,
        collector,
        config=LifecycleConfig(
            num_steps=cfg.steps,
            rank=rank,
            world_size=world,
            start_step=start_step,
            start_weight_version=start_version,
            trace_path=run_dir / f"trace.rank{rank}.jsonl",
        ),
        barrier=TorchBarrier(timeout_s=300) if world > 1 else None,
        drain=NoDeviceDrain("demo on the CPU") if cfg.device != "cuda" else DeviceDrain(),
        # SIGTERM agreed at a step boundary: that step saves and is the run's last (the latch reads it once)
        checkpoint=CheckpointDecision(
            cfg.checkpoint_every,
            save_and_stop=(lambda: stop.signum == signal.SIGTERM) if cfg.save_on_signal else None,
            agree=stop.agree_any if world > 1 else None,
        ),
        validation=ValidationDecision(cfg.validate_every),
        validator=validator,
        checkpoint_extra=checkpoint_extra,
    )
    lc_ref["lc"] = lc
    if cfg.serve:
        # /health's status, admission in the spec's resting states with the engine awake, /metrics' lifecycle series
        served.attach_lifecycle(lc)
    timer = StateTimer(lc.spec)  # time in each state per step, one trace record at a time
    lc.trace.subscribe(timer)
    visited: set[str] = set()  # states entered during the current step: what the machine did, not a re-derivation
    lc.trace.subscribe(lambda rec: visited.add(rec.dest))
    display = ProgressDisplay(cfg.steps, requests=engine.request_counts) if show else None
    if display is not None:
        follow(display, lc.trace, lc.spec)  # the shown state follows every transition (throttled)
        display.event(f"run folder: {run_dir}")
        display.event(
            f"engine: backend={engine.backend_name} ({engine.backend_reason}); "
            f"kv_cache_mode={engine.kv_cache_mode.value}; inflight={cfg.inflight} (a handoff "
            f"{_INFLIGHT_WORDS.get(cfg.inflight, cfg.inflight)}); "
            f"one model object for training and generation; "
            f"{world} rank(s) over {'NCCL' if cfg.device == 'cuda' else 'gloo'}"
        )
        if cfg.resume:
            display.event(
                f"resumed from {ckpt_dir / 'latest'}: step {start_step}, weight version {start_version}, "
                f"{len(buffer)} buffered groups, {stream_index} prompts drawn, "
                f"{len(collector.returned_prompts)} deferred or parked prompts to roll out first"
            )
    rewards_seen: list[float] = []
    val_acc: float | None = None
    steps_this_run = 0
    t_loop = time.monotonic()
    last_saved: int | None = None
    saving_step_ran = False  # the step after an agreed SIGTERM ran (its latch saved and made it the last)
    try:
        lc.start()
        if show:  # one line: the run is up and a signal from now on stops it at a step boundary
            on_term = "saves a checkpoint at the next step boundary and stops" if cfg.save_on_signal else "stops"
            print(f"ready: training from step {start_step}; SIGTERM {on_term}, SIGINT stops", flush=True)
        if cfg.serve and show:
            # one line, machine-readable: external agents/gyms build OpenAI clients against these
            print(f"dp_openai_server_base_urls={json.dumps(lc.dp_openai_server_base_urls)}", flush=True)
            if display is not None:
                display.event(f"OpenAI-compatible servers (127.0.0.1 only): {lc.dp_openai_server_base_urls}")
        while not lc.finished:
            groups = buffer.sample(lc.weight_version, timeout=cfg.sample_timeout_s)
            sig = stop.agree()  # every rank's signal: all stop after the same step
            if sig and not (sig == signal.SIGTERM and cfg.save_on_signal and not saving_step_ran):
                break  # SIGINT, SIGTERM with save_on_signal off, or the saving step ran: stop here
            visited.clear()
            result = lc.step(_to_rollouts(groups))  # after an agreed SIGTERM: saves, and is the last step
            saving_step_ran = sig == signal.SIGTERM
            steps_this_run += 1
            if State.CHECKPOINTING.value in visited:
                last_saved = lc.step_index
            consumed += result.consumed_samples * dp
            reward = float(result.metrics.get("train/reward_mean", 0.0))
            rewards_seen.append(reward)
            if metrics is not None and display is not None:
                m = dict(result.metrics)
                m.update(step_metrics(buffer, collector, times=timer.pop_completed()))
                m["lifecycle/weight_version"] = float(lc.weight_version)
                ages = [g.age(lc.weight_version - 1) for g in groups]
                m["train/trajectory_age_mean"] = sum(ages) / len(ages)
                # facts read from what the machine did in this step (the trace), not re-derived from its rules
                validated = State.VALIDATING.value in visited
                saved = State.CHECKPOINTING.value in visited
                if validated and lc.last_validation:
                    m.update(lc.last_validation)
                    val_acc = float(lc.last_validation.get("val/accuracy", 0.0))
                rec = metrics.log(lc.step_index, m, consumed_samples=result.consumed_samples * dp)
                display.update(
                    state=lc.state.value,
                    step=lc.step_index,
                    weight_version=lc.weight_version,
                    reward=reward,
                    consumed=rec["train/consumed_samples"],
                    samples_per_s=(consumed - consumed0) / max(1e-9, time.monotonic() - t_loop),
                )
                if saved:
                    display.event(
                        f"checkpoint saved: {ckpt_dir / f'step_{lc.step_index:08d}'} "
                        f"(weight version {lc.weight_version})"
                    )
                if validated:
                    display.event(
                        f"validation at step {lc.step_index}: accuracy {val_acc:.3f}, "
                        f"reward {m.get('val/reward', 0.0):.3f}"
                    )
            if cfg.stop_after is not None and steps_this_run >= cfg.stop_after and not lc.finished:
                if display is not None:
                    display.event(f"stopping early after {steps_this_run} steps (--stop-after)")
                break
        if stop.signum and display is not None:
            saved_note = f"checkpoint saved at step {last_saved}" if last_saved == lc.step_index else "no checkpoint"
            display.event(f"stopping: {signal.Signals(stop.signum).name} (after step {lc.step_index}; {saved_note})")
    finally:
        try:
            lc.stop()
        finally:
            collector.close()
            if display is not None:
                display.close()
            if metrics is not None:
                metrics.close()
            lc.trace.close()
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # every rank's trace is complete before rank 0 draws the timeline
    result_out = None
    if show:
        _write_artifacts(run_dir, world, lc.spec)
        n = min(10, len(rewards_seen))
        result_out = DemoResult(
            run_dir=str(run_dir),
            start_step=start_step,
            end_step=lc.step_index,
            weight_version=lc.weight_version,
            first_rewards=sum(rewards_seen[:n]) / max(1, n),
            last_rewards=sum(rewards_seen[-n:]) / max(1, n),
            val_accuracy=val_acc,
            consumed_samples=consumed,
            elapsed_s=time.monotonic() - t_start,
            backend=engine.backend_name,
            stopped_by_signal=stop.signum or None,
            checkpoint_step=last_saved,
        )
        (run_dir / "result.json").write_text(json.dumps(result_out.__dict__, indent=1), encoding="utf-8")
    shutdown_distributed()
    return result_out


def _write_artifacts(run_dir: Path, world: int, spec: LifecycleSpec) -> None:
    """The run's lifecycle as a picture (lifecycle.svg, drawn without Graphviz) and as Mermaid and DOT text,
    all from the spec the run used, and the per-rank timeline picture."""
    try:
        from colo_fsm.diagram import diagram_text, write_svg

        write_svg(run_dir / "lifecycle.svg", spec)
        (run_dir / "lifecycle.mmd").write_text(diagram_text("mermaid", spec), encoding="utf-8")
        (run_dir / "lifecycle.dot").write_text(diagram_text("dot", spec), encoding="utf-8")
    except Exception as exc:  # the diagram is a by-product: never fail the run for it
        log.warning("could not write the lifecycle diagram: %s", exc)
    try:
        from colo_fsm.timeline import render_timeline

        traces = [run_dir / f"trace.rank{r}.jsonl" for r in range(world)]
        render_timeline(
            [t for t in traces if t.exists()],
            run_dir / "timeline.png",
            title="colo-fsm demo: lifecycle states per rank",
        )
    except Exception as exc:
        log.warning("could not draw the timeline: %s", exc)


def _worker(rank: int, cfg: DemoConfig, run_dir: str, world: int, init_method: str) -> None:
    run_rank(cfg, Path(run_dir), rank, world, init_method)


def launch(cfg: DemoConfig) -> DemoResult:
    """Run the demo: in this process for one rank, else ``cfg.ranks`` spawned processes; returns rank 0's result."""
    run_dir = resolve_run_dir(cfg)
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda", "'cpu' on a machine without a CUDA device")
        if cfg.ranks > torch.cuda.device_count():
            raise ConfigError("ranks", cfg.ranks, f"at most the {torch.cuda.device_count()} visible GPU(s)")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / ("config.resume.json" if cfg.resume else "config.json")).write_text(
        json.dumps({**cfg.to_dict(), "run_dir": str(run_dir)}, indent=1), encoding="utf-8"
    )
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:  # started by torchrun: one rank here
        res = run_rank(cfg, run_dir, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
        return res or _read_result(run_dir)
    if cfg.ranks == 1:
        res = run_rank(cfg, run_dir)
        assert res is not None
        return res
    import torch.multiprocessing as mp

    from colo_fsm.adapters.megatron.parallel import free_port

    init_method = f"tcp://127.0.0.1:{free_port()}"
    from colo_fsm.demo.signals import run_ranks_forwarding_signals

    (run_dir / "result.json").unlink(missing_ok=True)  # the result of an earlier run here: never read as this one's
    args = (cfg, str(run_dir), cfg.ranks, init_method)
    got = run_ranks_forwarding_signals(
        lambda: mp.start_processes(_worker, args=args, nprocs=cfg.ranks, join=False, start_method="spawn"),
        stop_timeout_s=cfg.stop_timeout_s,
    )
    res = _read_result(run_dir)
    if got is not None and res.stopped_by_signal is None:  # the ranks finished their last step meanwhile
        res = replace(res, stopped_by_signal=got)
    return res


def _read_result(run_dir: Path) -> DemoResult:
    data = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return DemoResult(**data)


__all__ = ["DemoResult", "default_run_dir", "launch", "resolve_run_dir", "run_rank"]
