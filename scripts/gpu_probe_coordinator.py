"""First contact with megatron-core's coordinator mode through the lifecycle's handoff (one GPU, < 4 min).

    python3 scripts/gpu_probe_coordinator.py [--out DIR]

Sections (each in its own try/except, so one failure does not hide the others; every exception is printed
with its traceback):

  env        versions of torch, megatron-core, pyzmq, msgpack, quart, hypercorn
  dense-*    a small GPT: ``MegatronAsyncLLM(use_coordinator=True)`` bring-up, the engine loop thread's CUDA
             device, a few requests submitted, pause -> PAUSED -> suspend -> SUSPENDED mid-flight, one train
             step on the same model, generation epoch set, resume -> RESUMED(PAUSED) -> unpause -> RUNNING, every
             request finishes; EngineState, timings and ``policy_epoch`` printed at each point.
             Run in persist and in recompute (a second engine on the same model, after shutdown).
  adapter-lifecycle  colo-fsm's CoordinatorEngine under the Lifecycle (start, requests parked across lc.step, stop)
  moe        the same cycle on a small MoE GPT (4 experts, top-2, EP=1) with the model-mode report before the
             training forward
  death      a request megatron's add_request asserts on (log-probs with prompt log-probs, while only the
             last token's logits are materialized): how the engine-loop task ends and what the caller sees
  frontend   whether megatron's own OpenAI frontend can start here (Quart/Hypercorn importable)

The coordinator is started with multiprocessing *spawn*: this file is import-safe (``__main__`` guard).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OUT: dict[str, Any] = {"sections": {}, "errors": {}}
T0 = time.perf_counter()


def say(*a: Any) -> None:
    print(f"[{time.perf_counter() - T0:7.2f}s]", *a, flush=True)


def section(name: str):
    def deco(fn):
        def run(*a, **k):
            say(f"=== {name}")
            t = time.perf_counter()
            try:
                res = fn(*a, **k)
                OUT["sections"][name] = {"ok": True, "s": round(time.perf_counter() - t, 3), **(res or {})}
                say(f"=== {name} OK in {time.perf_counter() - t:.2f}s")
                return res
            except BaseException as exc:
                tb = traceback.format_exc()
                OUT["errors"][name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": tb}
                OUT["sections"][name] = {"ok": False, "s": round(time.perf_counter() - t, 3)}
                say(f"=== {name} FAILED: {type(exc).__name__}: {exc}\n{tb}")
                return None

        return run

    return deco


def on_loop(llm: Any, coro: Any, timeout: float = 60.0) -> Any:
    """Run ``coro`` on megatron's background loop (the engine loop's) and wait, bounded."""
    loop = llm.engine.engine_loop_task.get_loop()
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fut.result(timeout=0.2)
        except TimeoutError:
            task = llm.engine.engine_loop_task
            if task.done():
                fut.cancel()
                raise RuntimeError(f"engine loop task ended while waiting: {task!r}") from None
            if time.monotonic() > deadline:
                fut.cancel()
                raise TimeoutError(f"no answer in {timeout}s; engine state {llm.engine.state}") from None


def state(llm: Any) -> str:
    return str(getattr(llm.engine.state, "name", llm.engine.state))


def sampling(n: int, logprobs: bool = True, skip_prompt: bool = True) -> Any:
    from megatron.core.inference.sampling_params import SamplingParams

    return SamplingParams(
        temperature=1.0,
        top_k=1,
        num_tokens_to_generate=n,
        termination_id=-1,
        return_log_probs=logprobs,
        skip_prompt_log_probs=skip_prompt,
    )


def build_dense(hidden: int, layers: int, seq: int) -> Any:
    from colo_fsm.adapters.megatron.model import ModelConfig, build_model

    return build_model(
        ModelConfig(
            vocab_size=64,
            hidden_size=hidden,
            num_layers=layers,
            num_attention_heads=8,
            max_sequence_length=seq,
            device="cuda",
        )
    )


def build_moe(hidden: int, layers: int, seq: int, experts: int = 4) -> Any:
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    from colo_fsm.adapters.megatron.attention import SDPAttention
    from colo_fsm.adapters.megatron.model import paged_attention_kwargs

    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False)
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    torch.manual_seed(7)
    model_parallel_cuda_manual_seed(7, force_reset_rng=True)
    cfg = TransformerConfig(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=8,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_moe_experts=experts,
        moe_router_topk=2,
        moe_token_dispatcher_type="alltoall",
        moe_aux_loss_coeff=0.0,
        add_bias_linear=False,  # the expert MLP's in-place bias add on a parallel-region view fails in training
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        bf16=True,
        **paged_attention_kwargs("cuda"),
    )
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=spec,
        vocab_size=64,
        max_sequence_length=seq,
        position_embedding_type="learned_absolute",
        parallel_output=False,
        share_embeddings_and_output_weights=False,
    )
    model = model.cuda().bfloat16()
    model.eval()
    return model


def rollouts(n: int, plen: int = 24, clen: int = 48) -> list[Any]:
    import random

    from colo_fsm.adapters.megatron.trainer import Rollout

    rng = random.Random(0)
    return [
        Rollout(
            prompt_ids=tuple(rng.randrange(3, 50) for _ in range(plen)),
            completion_ids=tuple(rng.randrange(3, 50) for _ in range(clen)),
            reward=rng.random(),
            group=i // 4,
        )
        for i in range(n)
    ]


def cycle(model: Any, mode: str, *, label: str, n_req: int = 8, seq: int = 1024) -> dict[str, Any]:
    """Bring-up, requests in flight, pause/suspend, train, epoch, resume/unpause, finish, shutdown."""
    import torch
    from megatron.core.inference.apis import MegatronAsyncLLM
    from megatron.core.inference.config import InferenceConfig, KVCacheManagementMode
    from megatron.core.inference.utils import InferenceMode

    from colo_fsm.adapters.megatron.mode import mode_control
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    res: dict[str, Any] = {"mode": mode, "states": []}

    def mark(tag: str) -> None:
        st = state(llm)
        active = llm.engine.context.get_active_request_count()
        waiting = len(llm.engine.waiting_request_ids)
        rec = {
            "at": tag,
            "state": st,
            "active": active,
            "waiting": waiting,
            "inference_mode": InferenceMode.is_active(),
        }
        res["states"].append(rec)
        say(
            f"  [{label}] {tag}: EngineState={st} active={active} waiting={waiting} InferenceMode={rec['inference_mode']}"
        )

    tok = CharTokenizer()
    control = mode_control(model)
    trainer = MegatronTrainer(model, TrainerConfig(lr=1e-3, backend="torch"))
    icfg = InferenceConfig(
        block_size_tokens=256,
        buffer_size_gb=2.0,
        max_requests=64,
        max_sequence_length=seq,
        kv_cache_management_mode=KVCacheManagementMode(mode),
        materialize_only_last_token_logits=True,
    )
    model.eval()
    t = time.perf_counter()
    llm = MegatronAsyncLLM(model=model, tokenizer=tok, inference_config=icfg, use_coordinator=True)
    res["bring_up_s"] = round(time.perf_counter() - t, 3)
    say(f"  [{label}] bring-up {res['bring_up_s']} s")
    mark("after bring-up")
    try:

        async def loop_device() -> int:
            return torch.cuda.current_device()

        res["loop_thread_device"] = on_loop(llm, loop_device())
        res["main_device"] = torch.cuda.current_device()
        say(f"  [{label}] engine loop thread device {res['loop_thread_device']} (main {res['main_device']})")
        client = llm._coord_runtime.client

        async def set_epoch(e: int) -> None:
            client.set_generation_epoch(e)

        on_loop(llm, set_epoch(0))
        import random

        rng = random.Random(1)
        lengths = [64, 96, 128, 192, 256, 320, 384, 512][:n_req]
        futs = []
        t_submit = time.perf_counter()
        for n in lengths:
            p = [rng.randrange(3, 50) for _ in range(32)]
            futs.append(
                asyncio.run_coroutine_threadsafe(llm.generate(p, sampling(n)), llm.engine.engine_loop_task.get_loop())
            )
        # let it decode a while, then park
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(f.done() for f in futs) < 1:
            time.sleep(0.01)
        res["done_before_pause"] = sum(f.done() for f in futs)
        mark("before pause")
        t = time.perf_counter()
        on_loop(llm, llm.pause())
        res["pause_s"] = round(time.perf_counter() - t, 4)
        mark("after pause")
        t = time.perf_counter()
        on_loop(llm, llm.suspend())
        torch.cuda.synchronize(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))
        res["suspend_s"] = round(time.perf_counter() - t, 4)
        mark("after suspend")
        res["in_flight_at_suspend"] = sum(not f.done() for f in futs)
        rep = control.report()
        res["mode_before_train"] = {"off_training": [list(map(str, x)) for x in rep.off_training()]}
        say(f"  [{label}] mode off-training before to_training: {rep.off_training()}")
        control.to_training()
        say(f"  [{label}] mode off-training after to_training: {control.report().off_training()}")
        t = time.perf_counter()
        out = trainer.train_step(rollouts(8))
        torch.cuda.synchronize()
        res["train_s"] = round(time.perf_counter() - t, 4)
        res["train_loss"] = out.metrics.get("train/loss")
        say(f"  [{label}] train step {res['train_s']} s loss {res['train_loss']}")
        trainer.offload_buffers()
        trainer.restore_buffers()
        control.to_inference()
        on_loop(llm, set_epoch(1))
        t = time.perf_counter()
        on_loop(llm, llm.resume())
        res["resume_s"] = round(time.perf_counter() - t, 4)
        mark("after resume")
        t = time.perf_counter()
        on_loop(llm, llm.unpause())
        res["unpause_s"] = round(time.perf_counter() - t, 4)
        mark("after unpause")
        reqs = [f.result(timeout=120) for f in futs]
        res["all_s"] = round(time.perf_counter() - t_submit, 3)
        res["requests"] = []
        for n, r in zip(lengths, reqs):
            gen = list(r.generated_tokens or [])
            lps = list(r.generated_log_probs or [])
            res["requests"].append(
                {
                    "asked": n,
                    "got": len(gen),
                    "logprobs": len(lps),
                    "prompt_len": len(r.prompt_tokens) if r.prompt_tokens is not None else None,
                    "policy_epoch": r.policy_epoch,
                    "kv_cache_epoch": r.kv_cache_epoch,
                    "status": str(r.status),
                }
            )
        for q in res["requests"]:
            say(f"  [{label}] req {q}")
        # a second park cycle straight away (no train) to check RESUMED -> next SUSPEND
        t = time.perf_counter()
        on_loop(llm, llm.pause())
        on_loop(llm, llm.suspend())
        on_loop(llm, llm.resume())
        on_loop(llm, llm.unpause())
        res["idle_cycle_s"] = round(time.perf_counter() - t, 4)
        mark("after idle cycle")
    finally:
        t = time.perf_counter()
        # shutdown() joins megatron's loop thread: it must be awaited from another loop (here: a fresh one)
        asyncio.run(asyncio.wait_for(llm.shutdown(), 60))
        res["shutdown_s"] = round(time.perf_counter() - t, 4)
        say(f"  [{label}] shutdown {res['shutdown_s']} s, state {state(llm)}")
        proc = getattr(llm.engine, "inference_coordinator_process", None)
        res["coordinator_alive_after_shutdown"] = bool(proc is not None and proc.is_alive())
        if proc is not None and proc.is_alive():
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    for noisy in ("megatron", "torch", "py.warnings", "transitions"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    @section("env")
    def env() -> dict[str, Any]:
        import importlib

        import torch

        out: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
        for mod in ("megatron.core", "zmq", "msgpack", "quart", "hypercorn", "flash_attn", "openai"):
            try:
                m = importlib.import_module(mod)
                out[mod] = getattr(m, "__version__", "present")
            except Exception as exc:
                out[mod] = f"MISSING ({type(exc).__name__}: {exc})"
        say(json.dumps(out))
        return out

    env()
    from colo_fsm.adapters.megatron.parallel import init_distributed

    init_distributed(1, device="cuda")
    state_holder: dict[str, Any] = {}

    @section("dense-persist")
    def dense_persist() -> dict[str, Any]:
        model = build_dense(args.hidden, args.layers, 1024)
        state_holder["dense"] = model
        return cycle(model, "persist", label="dense-persist")

    @section("dense-recompute")
    def dense_recompute() -> dict[str, Any]:
        model = state_holder.get("dense") or build_dense(args.hidden, args.layers, 1024)
        return cycle(model, "recompute", label="dense-recompute")

    @section("moe")
    def moe() -> dict[str, Any]:
        model = build_moe(args.hidden, args.layers, 1024)
        state_holder["moe"] = model
        return cycle(model, "persist", label="moe")

    @section("adapter-lifecycle")
    def adapter() -> dict[str, Any]:
        """colo-fsm's CoordinatorEngine under the Lifecycle (only on a checkout that has the adapter)."""
        from colo_fsm.adapters.megatron.coordinator import CoordinatorConfig, CoordinatorEngine
        from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
        from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig
        from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig

        model = state_holder.get("dense") or build_dense(args.hidden, args.layers, 1024)
        box: dict[str, Any] = {}
        eng = CoordinatorEngine(
            model,
            CharTokenizer(),
            CoordinatorConfig(buffer_size_gb=2.0, control_timeout_s=60.0),
            max_sequence_length=1024,
            weight_version=lambda: box["lc"].weight_version if "lc" in box else 0,
        )
        lc = box["lc"] = Lifecycle(
            eng, MegatronTrainer(model, TrainerConfig(backend="torch")), None, config=LifecycleConfig()
        )
        t = time.perf_counter()
        lc.start()
        res: dict[str, Any] = {"start_s": round(time.perf_counter() - t, 3), "loop_device": eng.loop_device}
        try:
            handles = [eng.submit(list(range(3, 35)), max_tokens=n) for n in (64, 256, 512)]
            time.sleep(0.3)
            t = time.perf_counter()
            lc.step(rollouts(8))
            res["step_s"] = round(time.perf_counter() - t, 3)
            outs = [h.result(timeout=120) for h in handles]
            res["lengths"] = [len(c.token_ids) for c in outs]
            res["versions_first_last"] = [(c.weight_versions[:1], c.weight_versions[-1:]) for c in outs]
            res["trace_engine_states"] = [(r.trigger, r.dest, r.engine_state) for r in lc.trace.records]
            res["timings"] = eng.timings
            res["transitions"] = eng.transitions
        finally:
            lc.stop()
        say(f"  [adapter] {res}")
        return res

    @section("frontend")
    def frontend() -> dict[str, Any]:
        from megatron.core.inference.text_generation_server.dynamic_text_gen_server import (  # noqa: F401
            text_generation_server,
        )

        return {"importable": True}

    @section("death")
    def death() -> dict[str, Any]:
        from megatron.core.inference.apis import MegatronAsyncLLM
        from megatron.core.inference.config import InferenceConfig

        from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

        model = state_holder.get("dense") or build_dense(args.hidden, args.layers, 1024)
        model.eval()
        llm = MegatronAsyncLLM(
            model=model,
            tokenizer=CharTokenizer(),
            inference_config=InferenceConfig(
                buffer_size_gb=1.0, max_requests=16, max_sequence_length=512, materialize_only_last_token_logits=True
            ),
            use_coordinator=True,
        )
        loop = llm.engine.engine_loop_task.get_loop()
        ok = asyncio.run_coroutine_threadsafe(llm.generate([5, 6, 7], sampling(8)), loop)
        say(f"  [death] a good request: {len(ok.result(timeout=60).generated_tokens)} tokens")
        bad = asyncio.run_coroutine_threadsafe(llm.generate([5, 6, 7], sampling(8, skip_prompt=False)), loop)
        t = time.perf_counter()
        task = llm.engine.engine_loop_task
        while not task.done() and time.perf_counter() - t < 20:
            time.sleep(0.05)
        res: dict[str, Any] = {"task_done_after_s": round(time.perf_counter() - t, 3), "task_done": task.done()}
        thread = getattr(llm._loop_manager, "_thread", None)
        res["loop_thread_alive"] = bool(thread is not None and thread.is_alive())
        res["bad_future_done"] = bad.done()
        res["engine_state"] = state(llm)
        if task.done():
            try:
                res["task_exception"] = repr(task.exception())
            except BaseException as exc:
                res["task_exception"] = f"{type(exc).__name__}: {exc}"
        say(f"  [death] {res}")
        proc = getattr(llm.engine, "inference_coordinator_process", None)
        res["coordinator_alive"] = bool(proc is not None and proc.is_alive())
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        return res

    dense_persist()
    adapter()
    dense_recompute()
    moe()
    frontend()
    death()
    OUT["total_s"] = round(time.perf_counter() - T0, 2)
    say("SUMMARY", json.dumps({k: v.get("ok") for k, v in OUT["sections"].items()}))
    if args.out:
        p = Path(args.out)
        p.mkdir(parents=True, exist_ok=True)
        (p / "coord_probe.json").write_text(json.dumps(OUT, indent=1, default=str))
    os._exit(0)  # a dead engine loop leaves daemon threads and a coordinator child behind: do not wait for them


if __name__ == "__main__":
    main()
