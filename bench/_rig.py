"""The rig every mode of one handoff-bench process shares: the model, the trainer and the engine, built and warmed
once (not a benchmark itself: ``run_all`` skips files starting with ``_``).

At the reasoning shape, building the engine (the KV buffer, megatron-core's CUDA-graph capture, flash-attention's
kernel compilation) and warming it took about 100 s per mode when each mode rebuilt it. Here it is built once per
process and each mode's :class:`~colo_fsm.machine.lifecycle.Lifecycle` borrows it through an :class:`EngineLease`:
the lifecycle's ``bring_up`` adopts the built engine and its ``shutdown`` ends the lease, after which the rig
settles the engine (resumed, every request the mode left behind aborted) and switches its in-flight policy for the
next mode (:meth:`~colo_fsm.adapters.megatron.engine.MegatronEngine.set_inflight`). The model keeps training
from mode to mode: output lengths are drawn, not sampled (the tokenizer's end-of-document id lies outside the
vocabulary), so what a mode measures does not depend on the weights it starts from.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench._handoff import ENGINES
from bench._workload import Shape, alphabet_of, model_config
from colo_fsm.guards.engine_state import engine_state_of

SETTLE_S = 120.0  # how long the rig waits for a mode's leftover requests to leave the engine before it fails


class EngineLease:
    """The rig's engine as one mode's lifecycle sees it (everything but the two calls below goes to the engine).

    ``bring_up`` builds the engine the first time and adopts it after; ``shutdown`` ends the lease and leaves the
    engine built (the rig tears it down once, at the end). While no lease is held the engine reports no condition
    (the lifecycle that ended the lease expects a torn-down engine there; the rig knows it is not).
    """

    def __init__(self, engine: Any) -> None:
        self.real = engine
        self.leased = False
        self.leases = 0

    def bring_up(self) -> None:
        """Build the engine once; later leases adopt it as it is (awake, settled by the rig)."""
        if not self.real.built:
            self.real.bring_up()
        self.leased = True
        self.leases += 1

    def shutdown(self) -> None:
        """End this lease; the engine stays built for the next mode."""
        self.leased = False

    def engine_state(self) -> Any:
        """The engine's own report while leased, none between leases."""
        return engine_state_of(self.real) if self.leased else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@dataclass
class Rig:
    """Model, trainer and engine of one bench process, plus the version source every mode's lifecycle sets."""

    model: Any
    trainer: Any
    engine: EngineLease
    tokenizer: Any
    version: dict[str, Callable[[], int]] = field(default_factory=lambda: {"source": lambda: 0})
    build_s: float = 0.0
    warm_s: float = 0.0

    def weight_version(self) -> int:
        """The weight version of the lifecycle running now (0 outside a mode)."""
        return int(self.version["source"]())

    def settle(self, close: Callable[[], None] | None = None, timeout_s: float = SETTLE_S) -> None:
        """After a mode: the engine awake again, then ``close`` (the mode's collector: it cancels the rollouts the
        mode's stop took back and awaits them, so no task is left pending; each cancelled request is aborted by
        the awake engine at its next step boundary), then no request left. Raises if requests are still there
        after ``timeout_s``."""
        self.version["source"] = lambda: 0
        real = self.engine.real
        if not real.awake:
            real.resume()
        if close is not None:
            close()
        deadline = time.monotonic() + timeout_s
        while tuple(real.request_counts()) != (0, 0, 0):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the engine still holds requests {tuple(real.request_counts())} (queued, running, parked) "
                    f"{timeout_s:.0f} s after the mode ended: the next mode would measure them"
                )
            time.sleep(0.01)

    def warm(self, prompts: list[list[int]], *, max_tokens: int, temperature: float, batch_of: Callable) -> None:
        """Run the engine once over ``prompts`` and the trainer once over what came out (graphs replayed, kernels
        compiled, allocator warmed), so no mode's first step pays for it."""
        from colo_fsm.adapters.batching import Priority

        t0 = time.monotonic()
        real = self.engine.real
        handles = [
            real.submit(p, max_tokens=max_tokens, temperature=temperature, priority=Priority.TRAINING) for p in prompts
        ]
        outs = [h.result(timeout=600) for h in handles]
        real.suspend()
        self.trainer.restore_buffers()
        self.trainer.train_step(batch_of(prompts, outs))
        self.trainer.offload_buffers()
        real.resume()
        self.warm_s = time.monotonic() - t0

    def close(self) -> None:
        """Tear the engine down (once, at the end of the process)."""
        if self.engine.real.built:
            self.engine.real.shutdown()


def build_rig(args: argparse.Namespace, shape: Shape) -> Rig:
    """The model, trainer and engine every mode of this process shares (built, then warmed, once)."""
    from colo_fsm.adapters.megatron.model import build_model
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig
    from colo_fsm.guards.memory import MemoryBudget

    t0 = time.monotonic()
    tok = CharTokenizer(alphabet_of(shape), generates_eod=False)  # each request stops at its drawn length
    model = build_model(
        model_config(
            shape, tok.vocab_size, device=args.device, seed=args.seed, cuda_graphs=args.cuda_graphs is not None
        )
    )
    # the trainer first: megatron-core's DDP may move parameters into its buffer before graphs are captured
    trainer = MegatronTrainer(
        model, TrainerConfig(lr=shape.lr, micro_batch_tokens=shape.micro_batch_tokens), pad_id=tok.pad
    )
    rig = Rig(model, trainer, EngineLease(None), tok)
    engine = ENGINES[args.engine]("park", args, shape, model, tok, rig.weight_version, shape.sequence_length)
    # the memory guard checks the forward this trainer runs: micro-batches of micro_batch_tokens padded tokens, or
    # one sequence where it is longer (the guard's default, 8 sequences of the model's length, is 262k tokens at
    # the 32,768 cut, which this trainer never runs)
    engine.memory_budget = MemoryBudget(
        micro_batch_tokens=shape.micro_batch_tokens, optimizer_shards=trainer.optimizer_shards
    )
    rig.engine = EngineLease(engine)
    rig.engine.bring_up()
    rig.engine.shutdown()  # built and awake; each mode's lifecycle takes its own lease
    rig.build_s = time.monotonic() - t0
    rng = random.Random(args.seed + 1)
    warm = [
        tok.tokenize("".join(rng.choice(tok.alphabet) for _ in range(shape.prompt_len)))
        for _ in range(shape.max_active_requests)
    ]
    rig.warm(
        warm,
        max_tokens=min(64, shape.max_tokens),
        temperature=shape.temperature,
        batch_of=lambda ps, outs: [
            Rollout(tuple(p), tuple(o.token_ids), 0.0, i // shape.samples_per_group, tuple(o.logprobs), 0)
            for i, (p, o) in enumerate(zip(ps, outs))
        ],
    )
    return rig


__all__ = ["SETTLE_S", "EngineLease", "Rig", "build_rig"]
