"""The handoff bench's workload: the model and run shapes, and the output length every mode draws for a request
(not a benchmark itself: ``run_all`` skips files starting with ``_``).

``bench/inflight_handoff.py`` runs it, ``bench/_rig.py`` builds the model and engine for it, and
``bench/handoff_model.py`` predicts from it; one definition, so the three agree on what a run of a given shape is.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from colo_fsm.adapters.megatron.model import MODEL_PRESETS, ModelConfig


@dataclass(frozen=True)
class Shape:
    """Model and workload of one run (the same for every mode)."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    alphabet_size: int
    prompt_len: int
    max_tokens: int
    median_tokens: float
    sigma: float
    num_prompts_per_step: int
    samples_per_group: int
    max_trajectory_age_steps: int
    steps: int  # measured steps per mode
    warmup: int  # steps before them for the modes that carry rollouts over (park, drain, abort): see warmup_steps
    max_active_requests: int
    lr: float
    temperature: float
    micro_batch_tokens: int = 16384  # the trainer's padded-token budget per micro-batch
    buffer_order: str = "start"  # ReplayBuffer(order=...): "start", or "deadline" (colo_fsm/collector/batch_order.py)

    @property
    def sequence_length(self) -> int:
        """The longest sequence a request makes: its prompt and its longest output."""
        return self.prompt_len + self.max_tokens


MODELS: dict[str, Shape] = {
    # CPU: a tiny GPT whose decode step costs about the same for 1 or 24 short requests (per-step overhead
    # dominates; the CPU path recomputes every sequence each step, so long batches stop being cheap)
    "small": Shape(16, 1, 4, 16, 4, 64, 3.0, 1.6, 8, 2, 3, 95, 5, 48, 1e-4, 0.0),
    # one GPU: ~200M parameters (16 layers x 1024 hidden), long tails
    "gpt200m": Shape(1024, 16, 16, 200, 16, 1024, 64.0, 1.3, 32, 4, 2, 18, 2, 512, 1e-5, 1.0),
}


def _preset(name: str, base: Shape, **kw: Any) -> Shape:
    """``base`` with the model shape of colo-fsm's preset ``name`` (hidden size, layers, heads)."""
    p = MODEL_PRESETS[name]
    return replace(
        base,
        hidden_size=p["hidden_size"],
        num_layers=p["num_layers"],
        num_attention_heads=p["num_attention_heads"],
        **kw,
    )


MODELS["gpt200m"] = _preset("gpt200m", MODELS["gpt200m"])
MODELS["gpt1b"] = _preset("gpt1b", MODELS["gpt200m"], micro_batch_tokens=8192)  # ~1.0B: less activation room
QUICK: dict[str, dict[str, Any]] = {
    "small": {"steps": 45, "warmup": 5},
    "gpt200m": {"steps": 10, "warmup": 2},
    "gpt1b": {"steps": 10, "warmup": 2},
}


def output_length(seed: int, prompt: int, sample: int, shape: Shape) -> int:
    """The drawn output length of one request (lognormal, cut to ``[1, max_tokens]``); the same in every mode."""
    rng = random.Random(seed * 1_000_003 + prompt * 1009 + sample)
    x = rng.lognormvariate(math.log(shape.median_tokens), shape.sigma)
    return max(1, min(shape.max_tokens, round(x)))


def alphabet_of(shape: Shape) -> str:
    """The bench tokenizer's characters (``alphabet_size`` of them)."""
    return "".join(chr(ord("a") + i) if i < 26 else chr(0x100 + i) for i in range(shape.alphabet_size))


def warmup_steps(mode: str, shape: Shape) -> int:
    """Steps a mode runs before its measured ones: every mode with a collector (park, drain, abort) carries
    rollouts from one step into the next, in the engine or in the buffer (a drain finishes every rollout in flight,
    up to ``max_age`` steps' worth, and the buffer keeps what the step does not train), so its steady state starts
    after ``shape.warmup`` steps; sync starts every step empty, which is its steady state from the first step on
    (the rig already warmed the engine and the trainer)."""
    return 0 if mode == "sync" else shape.warmup


def first_prompt(mode: str, shape: Shape) -> int:
    """The index of the first prompt a mode draws from the seeded stream. The modes with a collector train the
    prompts in the order they started (the buffer's ``start`` order), so their measured steps train the prompts
    after the ``shape.warmup`` steps' worth their warm-up trained; sync, which runs no warm-up, starts its stream
    there, so that every mode's measured steps train the same prompts. At a long cut a rare long draw decides a
    step, and a sync that drew the stream's first prompts read another part of the tail than park did."""
    return shape.warmup * shape.num_prompts_per_step if mode == "sync" else 0


def model_config(shape: Shape, vocab_size: int, *, device: str, seed: int, cuda_graphs: bool) -> ModelConfig:
    """The GPT of this shape, long enough for a prompt and its longest output."""
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        num_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        max_sequence_length=shape.sequence_length,
        device=device,
        seed=seed,
        cuda_graphs=cuda_graphs,
    )


__all__ = ["MODELS", "QUICK", "Shape", "alphabet_of", "model_config", "output_length", "warmup_steps"]
