"""The coordinator-mode handoff with expert or tensor parallelism, one process per GPU under torchrun.

    torchrun --nproc-per-node 2 scripts/gpu_coordinator_multi.py --ep 2          # MoE, experts over 2 GPUs
    torchrun --nproc-per-node 2 scripts/gpu_coordinator_multi.py --tp 2          # dense, tensor parallel
    torchrun --nproc-per-node 4 scripts/gpu_coordinator_multi.py --ep 2 --tp 2   # both

Every rank builds the same model (megatron's groups: ``init_distributed(tp, expert_model_parallel_size=ep)``)
and a :class:`~colo_fsm.adapters.megatron.coordinator.CoordinatorEngine` on it, under a
:class:`~colo_fsm.machine.lifecycle.Lifecycle` with a fingerprint barrier (every handoff exchanges state,
step, weight version and the model-mode digest). Rank 0 holds megatron's client: it submits requests of
several lengths, the lifecycle runs ``--steps`` steps while they are in flight (megatron parks them: pause and
suspend wait for expert-parallel consensus and a world barrier inside megatron), and every request must finish
with its requested length and per-token weight versions. The training step is a plain next-token loss with the
gradients reduced the way megatron's DDP reduces them: dense parameters over the data-parallel group, expert
parameters (``param.allreduce is False``) over the expert-data-parallel group.

Prints one JSON line per check and a summary; exits non-zero if a check failed. Written to run as it is on a
multi-GPU machine; it has not been run yet (only one GPU was lent).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RANK = int(os.environ.get("RANK", "0"))


def say(check: str, ok: bool, **info: Any) -> None:
    if RANK == 0 or not ok:
        print(json.dumps({"check": check, "ok": ok, "rank": RANK, **info}, default=str), flush=True)


class NextTokenTrainer:
    """A ``Trainer``: next-token loss on the rollouts' sequences, AdamW, megatron's gradient groups."""

    def __init__(self, model: Any, lr: float = 1e-4) -> None:
        import torch

        self.model = model
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        self.steps = 0

    def train_step(self, batch: Any) -> dict[str, float]:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        from colo_fsm.adapters.megatron.cpu_loop import forward_logits
        from colo_fsm.adapters.megatron.mode import mode_control
        from colo_fsm.guards.mode import check_training_mode

        check_training_mode(mode_control(self.model).report())
        self.model.train()
        dev = next(self.model.parameters()).device
        tokens = torch.tensor(batch, dtype=torch.long, device=dev)
        valid = torch.ones_like(tokens, dtype=torch.bool)
        logits = forward_logits(self.model, tokens, valid)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        dp, edp = ps.get_data_parallel_group(), ps.get_expert_data_parallel_group()
        for p in self.model.parameters():
            if p.grad is None:
                continue
            group = edp if getattr(p, "allreduce", True) is False else dp
            n = dist.get_world_size(group)
            if n > 1:
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(n)
        self.opt.step()
        self.model.eval()
        self.steps += 1
        return {"loss": float(loss.detach())}

    def offload_buffers(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def restore_buffers(self) -> None:
        pass

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Any) -> None:
        raise NotImplementedError("this script does not save")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--experts", type=int, default=None, help="MoE experts (default: 4 with --ep > 1, else dense)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--kv-mode", default="persist", choices=("persist", "recompute"))
    args = ap.parse_args()
    import torch

    from colo_fsm.adapters.megatron.coordinator import CoordinatorConfig, CoordinatorEngine
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model
    from colo_fsm.adapters.megatron.parallel import init_distributed, shutdown_distributed
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.guards.barrier import TorchBarrier
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig

    failed = 0
    setup = init_distributed(args.tp, device="cuda", expert_model_parallel_size=args.ep)
    say("setup", True, world=setup.world_size, tp=args.tp, ep=args.ep, dp=setup.data_parallel_size)
    experts = args.experts if args.experts is not None else (4 if args.ep > 1 else None)
    model = build_model(
        ModelConfig(
            vocab_size=64,
            hidden_size=512,
            num_layers=4,
            num_attention_heads=8,
            max_sequence_length=1024,
            device="cuda",
            tensor_model_parallel_size=args.tp,
            num_moe_experts=experts,
            expert_model_parallel_size=args.ep,
        )
    )
    box: dict[str, Lifecycle] = {}
    engine = CoordinatorEngine(
        model,
        CharTokenizer(),
        CoordinatorConfig(kv_cache_mode=args.kv_mode, buffer_size_gb=2.0, control_timeout_s=300.0),
        weight_version=lambda: box["lc"].weight_version if "lc" in box else 0,
    )
    trainer = NextTokenTrainer(model)
    lc = box["lc"] = Lifecycle(
        engine,
        trainer,
        None,
        config=LifecycleConfig(rank=setup.rank, world_size=setup.world_size),
        barrier=TorchBarrier(timeout_s=300.0),
    )
    rng = random.Random(0)
    batch = [[rng.randrange(3, 50) for _ in range(64)] for _ in range(8)]
    try:
        t = time.perf_counter()
        lc.start()
        say(
            "bring_up",
            engine.native_state() == "RUNNING",
            s=round(time.perf_counter() - t, 2),
            state=engine.native_state(),
            loop_device=engine.loop_device,
            local_rank=setup.local_rank,
        )
        lengths = [64, 256, 512, 768]
        handles = []
        if engine.is_primary:
            handles = [engine.submit([rng.randrange(3, 50) for _ in range(32)], max_tokens=n) for n in lengths]
            time.sleep(0.5)  # let them decode a little before the first handoff
        for _ in range(args.steps):
            lc.step(batch)
        say(
            "steps",
            True,
            weight_version=lc.weight_version,
            timings=engine.timing_summary(),
            engine_states=[(r.trigger, r.engine_state) for r in lc.trace.records][-4:],
        )
        if engine.is_primary:
            outs = [h.result(timeout=600) for h in handles]
            ok = all(len(c.token_ids) == n and len(c.weight_versions) == n for n, c in zip(lengths, outs))
            span = max(c.version_span for c in outs)
            if not ok:
                failed += 1
            say("parked_requests_finished", ok, lengths=[len(c.token_ids) for c in outs], max_version_span=span)
        torch.distributed.barrier()
    except Exception as exc:
        failed += 1
        say("run", False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    finally:
        try:
            lc.stop()
        except Exception as exc:
            failed += 1
            say("stop", False, error=f"{type(exc).__name__}: {exc}")
        shutdown_distributed()
    say("summary", failed == 0, failed=failed)
    return 1 if failed else 0


if __name__ == "__main__":  # import-safe: megatron's coordinator is started with multiprocessing spawn
    sys.exit(main())
