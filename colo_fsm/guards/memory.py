"""A memory budget checked before the engine is built: KV buffer + training peak + margin against the device.

In persist mode the KV buffer stays on the GPU through training; at scale it starves the training step (an
OOM in the first log-prob forward, hours into a run). :func:`estimate` adds what one rank holds at its
training peak (parameters, gradients, optimizer state unless offloaded, activations of the configured
micro-batch, the logits of the loss) to the KV buffer that stays resident and a margin, and
:func:`check_budget` refuses (:class:`~colo_fsm.errors.MemoryBudgetExceeded`) or warns, naming the numbers
and the options: a smaller ``buffer_size_gb``, KV offload/recompute, activation recompute, optimizer offload
(see :attr:`colo_fsm.states.rules.LifecycleRule.MEMORY_BUDGET`). :meth:`MemoryEstimate.breakdown` is a dict
in GiB, to compare with a measured peak (``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from colo_fsm.errors import ConfigError, MemoryBudgetExceeded
from colo_fsm.log import get_logger

log = get_logger(__name__)
GIB = float(1024**3)
_KV_MODES = ("persist", "offload", "recompute")
_ON_EXCEED = ("raise", "warn")


def _num(name: str, value: object, *, minimum: float = 0.0, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < minimum:
        raise ConfigError(name, value, f"a finite number >= {minimum:g}" + (" or None" if allow_none else ""))


DEFAULT_MICRO_BATCH_SIZE = 8
"""Sequences per training forward where a :class:`MemoryBudget` states neither ``micro_batch_size`` nor
``micro_batch_tokens``."""


@dataclass(frozen=True)
class MemoryBudget:
    """How the budget is checked: the device capacity (None: ask CUDA), the margin, and what to do over budget.

    The activations and logits are estimated for one training forward (:meth:`forward`): ``micro_batch_size``
    sequences (None: :data:`DEFAULT_MICRO_BATCH_SIZE`) of ``sequence_length`` tokens (None: the engine's longest
    sequence), or, for a trainer that packs a token budget per micro-batch (``MegatronTrainer``'s
    ``TrainerConfig.micro_batch_tokens``), one forward of ``max(micro_batch_tokens, sequence_length)`` tokens.
    ``activation_recompute`` estimates full-layer recomputation. ``optimizer_shards`` divides the optimizer
    state over the ranks that shard it (megatron's distributed optimizer: the data-parallel size;
    ``MegatronTrainer.optimizer_shards`` says it).
    """

    device_capacity_gib: float | None = None
    margin_fraction: float = 0.08
    margin_min_gib: float = 1.0  # CUDA context, allocator fragmentation, NCCL buffers
    on_exceed: str = "raise"
    micro_batch_size: int | None = None
    sequence_length: int | None = None
    micro_batch_tokens: int | None = None
    activation_recompute: bool = False
    optimizer_offloaded: bool = False  # optimizer state is off the device during the training step
    optimizer_shards: int = 1  # ranks the optimizer state is sharded over (megatron's distributed optimizer: DP)

    def __post_init__(self) -> None:
        _num("device_capacity_gib", self.device_capacity_gib, minimum=1e-9, allow_none=True)
        _num("margin_fraction", self.margin_fraction)
        if self.margin_fraction >= 1:
            raise ConfigError("margin_fraction", self.margin_fraction, "a fraction in [0, 1)")
        _num("margin_min_gib", self.margin_min_gib)
        if self.on_exceed not in _ON_EXCEED:
            raise ConfigError("on_exceed", self.on_exceed, f"one of {_ON_EXCEED}")
        for name in ("micro_batch_size", "sequence_length", "micro_batch_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(name, v, "a positive integer or None")
        v = self.optimizer_shards
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(
                "optimizer_shards",
                v,
                "a positive integer (the data-parallel size with a distributed optimizer, else 1)",
            )
        if self.micro_batch_tokens is not None and self.micro_batch_size is not None:
            raise ConfigError(
                "micro_batch_tokens",
                self.micro_batch_tokens,
                f"not together with micro_batch_size={self.micro_batch_size}: a token-budgeted micro-batch is one "
                "forward of max(micro_batch_tokens, sequence_length) tokens; state one of the two",
            )
        for name in ("activation_recompute", "optimizer_offloaded"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")

    def forward(self, max_sequence_length: int) -> tuple[int, int]:
        """The training forward the estimate is for, as (sequences, tokens each); ``max_sequence_length`` stands
        in for an unset ``sequence_length``."""
        seq = self.sequence_length or max_sequence_length
        if self.micro_batch_tokens is not None:
            return 1, max(self.micro_batch_tokens, seq)
        return self.micro_batch_size or DEFAULT_MICRO_BATCH_SIZE, seq


@dataclass(frozen=True)
class TrainingShape:
    """What one rank trains: its parameter count and bytes, and the transformer's shape (per rank: TP applied)."""

    num_parameters: int
    param_bytes: int  # 2 for bf16/fp16, 4 for fp32
    grad_bytes: int  # gradient bytes per parameter (a param-dtype .grad; 4 for an fp32 main_grad)
    optimizer_bytes_per_param: float  # torch AdamW: 2 moments in the param dtype; mixed-precision Adam: 12
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    tensor_parallel: int = 1
    flash_attention: bool = True  # attention scores are not materialized (SDPA flash / memory-efficient)


@dataclass(frozen=True)
class MemoryEstimate:
    """The budget's numbers, in GiB."""

    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    logits_gib: float
    kv_buffer_gib: float
    kv_during_training_gib: float
    margin_gib: float
    capacity_gib: float
    recompute_saves_gib: float
    micro_batch_size: int = 0  # the training forward the activations and logits were estimated for (0: not said)
    sequence_length: int = 0

    @property
    def training_peak_gib(self) -> float:
        """Parameters + gradients + optimizer state + activations + logits (one rank's training step)."""
        return self.params_gib + self.grads_gib + self.optimizer_gib + self.activations_gib + self.logits_gib

    @property
    def total_gib(self) -> float:
        """Training peak + the KV memory that stays resident through training + the margin."""
        return self.training_peak_gib + self.kv_during_training_gib + self.margin_gib

    @property
    def fits(self) -> bool:
        """Whether the total fits the device capacity."""
        return self.total_gib <= self.capacity_gib

    def breakdown(self) -> dict[str, float]:
        """Every number by name (GiB), for logs and for comparing with a measured peak."""
        return {
            "params_gib": self.params_gib,
            "grads_gib": self.grads_gib,
            "optimizer_gib": self.optimizer_gib,
            "activations_gib": self.activations_gib,
            "logits_gib": self.logits_gib,
            "training_peak_gib": self.training_peak_gib,
            "kv_buffer_gib": self.kv_buffer_gib,
            "kv_during_training_gib": self.kv_during_training_gib,
            "margin_gib": self.margin_gib,
            "total_gib": self.total_gib,
            "capacity_gib": self.capacity_gib,
        }

    def options(self) -> list[str]:
        """What would make it fit, with the numbers."""
        over = self.total_gib - self.capacity_gib
        out: list[str] = []
        if self.kv_during_training_gib > 0:
            room = self.kv_buffer_gib - over
            if room > 0:
                out.append(f"buffer_size_gb <= {math.floor(room * 100) / 100:.2f} (now {self.kv_buffer_gib:.2f})")
            out.append(
                f"kv_cache_mode='offload' or 'recompute' (the KV buffer leaves the GPU during training: "
                f"-{self.kv_during_training_gib:.2f} GiB)"
            )
        if self.recompute_saves_gib > 0:
            out.append(
                f"activation recompute (recompute_granularity='full': about -{self.recompute_saves_gib:.2f} GiB)"
            )
        if self.optimizer_gib > 0:
            out.append(
                f"optimizer state off the device during the training step (-{self.optimizer_gib:.2f} GiB; an "
                "optimizer that keeps it on the host through the step: MegatronTrainer's offload_optimizer_state "
                "moves it out only while generating), or megatron's distributed optimizer over your data-parallel "
                "ranks (MemoryBudget(optimizer_shards=trainer.optimizer_shards))"
            )
        if self.micro_batch_size and self.sequence_length:
            b, n = self.micro_batch_size, self.sequence_length
            out.append(
                f"a smaller training forward: the estimate assumes one micro-batch of {b} x {n:,} tokens "
                f"({b * n:,}; activations and logits {self.activations_gib + self.logits_gib:.2f} GiB); state your "
                "trainer's: MemoryBudget(micro_batch_tokens=N) for one that packs N tokens per micro-batch "
                "(MegatronTrainer: TrainerConfig.micro_batch_tokens), else MemoryBudget(micro_batch_size=..., "
                "sequence_length=...)"
            )
        else:
            out.append("a smaller micro-batch or sequence length")
        return out


def activation_bytes(shape: TrainingShape, micro_batch: int, seq: int, *, recompute: bool) -> float:
    """Activations kept for the backward of one micro-batch: per layer about ``s*b*h*34/t`` bytes for 16-bit
    activations (plus ``5*a*s^2*b/t`` when attention scores are materialized); with full recompute only
    each layer's input ``2*s*b*h`` plus one layer's full set."""
    s, b, h, a, t = seq, micro_batch, shape.hidden_size, shape.num_attention_heads, shape.tensor_parallel
    scale = shape.param_bytes / 2  # the coefficients are for 2-byte activations
    per_layer = s * b * h * 34 / t + (0 if shape.flash_attention else 5 * a * s * s * b / t)
    per_layer *= scale
    if recompute:
        return (2 * s * b * h * scale) * shape.num_layers + per_layer
    return per_layer * shape.num_layers


def estimate(
    shape: TrainingShape,
    budget: MemoryBudget,
    *,
    buffer_size_gb: float,
    kv_cache_mode: str,
    capacity_gib: float,
) -> MemoryEstimate:
    """The budget of one rank (see the module docstring)."""
    if kv_cache_mode not in _KV_MODES:
        raise ConfigError("kv_cache_mode", kv_cache_mode, f"one of {_KV_MODES}")
    _num("buffer_size_gb", buffer_size_gb)
    n = shape.num_parameters
    mbs, seq = budget.forward(1)  # an unset sequence_length: 1 here (the megatron adapter states the engine's)
    acts = activation_bytes(shape, mbs, seq, recompute=budget.activation_recompute)
    full = activation_bytes(shape, mbs, seq, recompute=False)
    recomputed = activation_bytes(shape, mbs, seq, recompute=True)
    # logits over the (TP-sharded) vocabulary, their log-softmax and its gradient
    logits = 3 * seq * mbs * shape.vocab_size / shape.tensor_parallel * shape.param_bytes
    return MemoryEstimate(
        params_gib=n * shape.param_bytes / GIB,
        grads_gib=n * shape.grad_bytes / GIB,
        optimizer_gib=0.0
        if budget.optimizer_offloaded
        else n * shape.optimizer_bytes_per_param / budget.optimizer_shards / GIB,
        activations_gib=acts / GIB,
        logits_gib=logits / GIB,
        kv_buffer_gib=float(buffer_size_gb),
        kv_during_training_gib=float(buffer_size_gb) if kv_cache_mode == "persist" else 0.0,
        margin_gib=max(budget.margin_fraction * capacity_gib, budget.margin_min_gib),
        capacity_gib=float(capacity_gib),
        recompute_saves_gib=0.0 if budget.activation_recompute else (full - recomputed) / GIB,
        micro_batch_size=mbs,
        sequence_length=seq,
    )


def check_budget(est: MemoryEstimate, budget: MemoryBudget) -> MemoryEstimate:
    """Raise :class:`~colo_fsm.errors.MemoryBudgetExceeded` (or warn, ``on_exceed="warn"``) when it does not fit."""
    if est.fits:
        log.info("memory budget fits: %.2f of %.2f GiB (%s)", est.total_gib, est.capacity_gib, _fmt(est))
        return est
    err = MemoryBudgetExceeded(est.breakdown(), est.capacity_gib, est.options())
    if budget.on_exceed == "raise":
        raise err
    log.warning("%s", err)
    return est


def _fmt(est: MemoryEstimate) -> str:
    return ", ".join(f"{k}={v:.2f}" for k, v in est.breakdown().items())


__all__ = [
    "DEFAULT_MICRO_BATCH_SIZE",
    "MemoryBudget",
    "MemoryEstimate",
    "TrainingShape",
    "activation_bytes",
    "check_budget",
    "estimate",
]
