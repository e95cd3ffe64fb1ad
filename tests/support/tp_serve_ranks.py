"""One rank of a tensor-parallel run that serves HTTP across training steps (gloo on the CPU).

Run as ``python -m tests.support.tp_serve_ranks RANK WORLD TP INIT_METHOD WORKDIR`` (tests/test_server_tp.py
starts WORLD of them). Every rank builds a tiny megatron-core GPT with tensor parallel TP, the colocated
:class:`~colo_fsm.adapters.megatron.engine.MegatronEngine` and a :class:`~colo_fsm.server.GatedEngine` with
``serve=True`` (the same SPMD program on every rank), and runs training steps through the lifecycle until rank 0
sees ``WORKDIR/stop``. Rank 0 writes ``urls.json`` (``dp_openai_server_base_urls``) once up, and ``steps`` after
every step. From the moment ``stop`` exists, each rank must have stopped its lifecycle within a bound well below
the engine's 300 s lockstep wait (a watchdog writes the result and exits otherwise, even from a rank stuck in a
step); it writes ``rank<R>.json``: steps, whether the stop finished within the bound, its role, its error if any. ``ROLE_ONLY`` in the environment: bring up, write the result, stop (layout
checks).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

STOP_BOUND_S = 60.0  # the lockstep waits up to 300 s: a stop that ends within this did not wait for it


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def batch(tok: Any, step: int) -> list[Any]:
    """The same training batch on every rank (tensor-parallel peers run the same shapes)."""
    from colo_fsm.adapters.megatron.trainer import Rollout

    out = []
    for i in range(4):
        a, b = (step * 7 + i) % 50, (step * 3 + 2 * i) % 50
        out.append(Rollout(tuple(tok.tokenize(f"{a}+{b}=")), tuple(tok.tokenize(str(a + b))), float(i % 2), i // 2))
    return out


def main(rank: int, world: int, tp: int, init: str, work: Path) -> int:
    import torch
    import torch.distributed as dist

    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model
    from colo_fsm.adapters.megatron.parallel import init_distributed
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig
    from colo_fsm.guards import TorchBarrier
    from colo_fsm.guards.drain import NoDeviceDrain
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
    from colo_fsm.server import GatedEngine
    from colo_fsm.server.templates import digits_chat_template

    rec: dict[str, Any] = {"rank": rank, "steps": 0, "error": None, "stopped_within_bound": None}
    finished = threading.Event()

    def watchdog() -> None:  # from the stop request on, the whole stop is bounded (a rank stuck in a step too)
        while not (work / "stop").exists() and not finished.is_set():
            time.sleep(0.1)
        if not finished.wait(STOP_BOUND_S):
            write_json(work / f"rank{rank}.json", {**rec, "stopped_within_bound": False, "stuck": True})
            os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    torch.set_num_threads(1)
    lc = None
    try:
        init_distributed(tp, device="cpu", rank=rank, world_size=world, init_method=init, timeout_s=90)
        tok = CharTokenizer()
        model = build_model(
            ModelConfig(
                vocab_size=64,
                hidden_size=32,
                num_layers=2,
                num_attention_heads=4,
                max_sequence_length=64,
                device="cpu",
                tensor_model_parallel_size=tp,
            )
        )
        trainer = MegatronTrainer(model, TrainerConfig(lr=1e-3, checkpoint_dir=str(work / "ckpt")), pad_id=tok.pad)
        box: list[Any] = []
        engine = MegatronEngine(
            model,
            tok,
            GenerationConfig(backend="cpu", max_active_requests=16, tp_lockstep=os.environ.get("NO_LOCKSTEP") != "1"),
            max_sequence_length=64,
            weight_version=lambda: box[0].weight_version if box else 0,
        )
        serve = os.environ.get("SERVE_RANKS", "all")
        gated = GatedEngine(
            engine,
            engine,
            serve=serve == "all" or str(rank) in serve.split(","),
            tokenizer=engine.tokenizer,
            chat_template=digits_chat_template,
            request_timeout_s=60.0,
            model_name="tp",
        )
        lc = Lifecycle(
            gated,
            trainer,
            config=LifecycleConfig(num_steps=10_000, rank=rank, world_size=world),
            drain=NoDeviceDrain("CPU"),
            barrier=TorchBarrier(timeout_s=60),
        )
        box.append(lc)
        gated.attach_lifecycle(lc)  # status, admission in serving states, the trace for /metrics
        lc.start()
        role = gated.role
        rec["role"] = None if role is None else {"group": list(role.group), "server": role.runs_server}
        rec["urls"] = list(lc.dp_openai_server_base_urls)
        if role is not None and not role.leader:  # HTTP traffic submitted on a follower could never run alone
            from colo_fsm.adapters.batching import Priority

            try:
                engine.submit(tok.tokenize("12"), max_tokens=2, priority=Priority.SERVER)
                rec["follower_http"] = "accepted"
            except Exception as exc:
                rec["follower_http"] = f"{type(exc).__name__}: {exc}"
        if rank == 0:
            write_json(work / "urls.json", rec["urls"])
        flag = torch.zeros(1, dtype=torch.int64)
        while os.environ.get("ROLE_ONLY") != "1":
            flag[0] = int((work / "stop").exists()) if rank == 0 else 0
            dist.broadcast(flag, src=0)  # the SPMD program stops on every rank at the same step
            if flag.item():
                break
            time.sleep(0.05)  # the engine decodes between handoffs
            lc.begin_step()
            lc.train(batch(tok, rec["steps"]))
            rec["steps"] += 1
            if rank == 0:
                write_json(work / "steps.json", rec["steps"])
    except BaseException as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()[-2000:]
    if lc is not None:
        done = threading.Event()

        def stop() -> None:
            try:
                lc.stop()
            except BaseException as exc:
                rec["stop_error"] = f"{type(exc).__name__}: {exc}"
            done.set()

        threading.Thread(target=stop, daemon=True).start()
        rec["stopped_within_bound"] = done.wait(STOP_BOUND_S)
    finished.set()
    write_json(work / f"rank{rank}.json", rec)
    sys.stdout.flush()
    os._exit(0)  # a stuck engine thread must not keep the process (the result says so)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
