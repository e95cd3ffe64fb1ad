"""The training side of the shared model: a GRPO-style policy-gradient step (``Trainer``).

Backends (``TrainerConfig.backend``):

* ``"megatron"`` (the default on CUDA): megatron-core's own training machinery, as a Megatron user knows it:
  its ``DistributedDataParallel`` (bucketed gradient reduction; ``overlap_grad_reduce``,
  ``use_distributed_optimizer`` and ``overlap_param_gather`` as options), its optimizer
  (``get_megatron_optimizer``: Adam, fp32 main parameters for a bf16 model, global grad-norm clipping) and its
  forward-backward schedule (``get_forward_backward_func()``) over the step's micro-batches. megatron-core's DDP
  and schedule need CUDA.
* ``"torch"`` (the default on the CPU): ``torch.optim.AdamW``, the same micro-batches run one after another,
  an explicit data-parallel gradient all-reduce and global-norm clipping over the TP group.

Both build micro-batches from a token budget (``micro_batch_tokens``, length-bucketed, see
:mod:`~colo_fsm.adapters.megatron.microbatch`): a step never pads the whole batch to its longest rollout, and its
loss and gradient are those of the one-pass step. Checkpoints go through megatron-core's ``dist_checkpointing``
(TP-aware) or torch DCP.

Offload: :meth:`MegatronTrainer.offload_buffers` frees every gradient (megatron: DDP's grad buffers) and, with
``offload_optimizer_state=True`` on CUDA, moves the optimizer state to pinned host memory; parameters are never
moved: generation reads them in place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from colo_fsm.adapters.megatron import train_backend
from colo_fsm.adapters.megatron.checkpoint import FORMATS, CheckpointInfo, load_checkpoint, save_checkpoint
from colo_fsm.adapters.megatron.cpu_loop import forward_logits
from colo_fsm.adapters.megatron.microbatch import MicroBatchPlan, plan_microbatches
from colo_fsm.adapters.megatron.mode import mode_control
from colo_fsm.adapters.megatron.model import check_trainable
from colo_fsm.adapters.megatron.parallel import on_own_device
from colo_fsm.adapters.megatron.train_backend import BACKENDS
from colo_fsm.adapters.protocols import StepResult
from colo_fsm.errors import ConfigError, LifecycleError
from colo_fsm.guards.mode import check_training_mode
from colo_fsm.log import get_logger

log = get_logger(__name__)


_MEGATRON_ONLY = ("overlap_grad_reduce", "use_distributed_optimizer", "overlap_param_gather")


@dataclass(frozen=True)
class TrainerConfig:
    """Optimizer, loss and training-machinery settings. ``clip_eps`` is the PPO-style ratio clip (used when
    rollouts carry the behaviour policy's log-probs); ``checkpoint_dir`` is where
    :meth:`MegatronTrainer.save_checkpoint` writes; ``micro_batch_tokens`` the padded-token budget of one
    micro-batch; ``backend`` and the DDP options pick megatron-core's training machinery (see the module doc).
    ``temperature`` is the sampling temperature of the rollouts: the trainer's log-probs are of ``logits /
    temperature``, the distribution the tokens were sampled from, to match behaviour log-probs recorded with the
    engine's ``logprobs_mode="processed"`` (leave 1.0 with ``"raw"``; top-k / top-p truncation is not modelled)."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    clip_eps: float = 0.2
    offload_optimizer_state: bool = False
    allow_inference_optimized_training: bool = False
    checkpoint_dir: str | None = None
    checkpoint_format: str = "auto"  # "megatron" (dist_checkpointing; default on CUDA) or "dcp" (default on CPU)
    temperature: float = 1.0  # the rollouts' sampling temperature: log-probs of logits / temperature
    micro_batch_tokens: int = 16384  # padded tokens per micro-batch (length-bucketed); bounds the step's peak memory
    backend: str = "auto"  # "megatron" (DDP + optimizer + schedule of megatron-core; CUDA), "torch", "auto"
    overlap_grad_reduce: bool = False  # megatron backend: reduce gradient buckets during the backward
    use_distributed_optimizer: bool = False  # megatron backend: shard optimizer state over data-parallel ranks
    overlap_param_gather: bool = False  # megatron backend: all-gather params in forward pre-hooks (needs the above)
    ddp_bucket_size: int | None = None  # megatron backend: DDP bucket size in elements (None: megatron's default)

    def __post_init__(self) -> None:
        for name in ("lr", "grad_clip", "clip_eps", "temperature"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or not math.isfinite(v):
                raise ConfigError(name, v, "a positive finite number")
        if (
            isinstance(self.weight_decay, bool)
            or not isinstance(self.weight_decay, int | float)
            or self.weight_decay < 0
        ):
            raise ConfigError("weight_decay", self.weight_decay, "a non-negative number")
        b = self.betas
        if (
            not isinstance(b, tuple | list)
            or len(b) != 2
            or any(isinstance(x, bool) or not isinstance(x, int | float) or not 0.0 <= x < 1.0 for x in b)
        ):
            raise ConfigError("betas", b, "a pair of numbers in [0, 1), e.g. (0.9, 0.98)")
        object.__setattr__(self, "betas", (float(b[0]), float(b[1])))
        for name in ("offload_optimizer_state", "allow_inference_optimized_training"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")
        if self.checkpoint_format not in FORMATS:
            raise ConfigError("checkpoint_format", self.checkpoint_format, f"one of {FORMATS}")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", self.backend, f"one of {BACKENDS}")
        mbt = self.micro_batch_tokens
        if isinstance(mbt, bool) or not isinstance(mbt, int) or mbt < 1:
            raise ConfigError("micro_batch_tokens", mbt, "a positive integer (padded tokens per micro-batch)")
        for name in _MEGATRON_ONLY:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ConfigError(
                "overlap_param_gather", True, "False unless use_distributed_optimizer=True (megatron-core needs both)"
            )
        bs = self.ddp_bucket_size
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 1):
            raise ConfigError("ddp_bucket_size", bs, "a positive number of elements, or None")
        if self.backend == "torch":
            on = [n for n in (*_MEGATRON_ONLY, "ddp_bucket_size") if getattr(self, n) not in (False, None)]
            if on:
                raise ConfigError(
                    on[0], getattr(self, on[0]), "unset with backend='torch' (a megatron-core DDP option)"
                )
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, str | Path):
            raise ConfigError("checkpoint_dir", self.checkpoint_dir, "a directory path (str or Path), or None")


@dataclass(frozen=True)
class Rollout:
    """One sampled completion of a prompt group: the unit the GRPO loss consumes.

    ``group`` identifies the prompt group (advantages are normalized within it); ``logprobs`` are the
    behaviour policy's token log-probs (empty: plain policy gradient, no ratio).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    reward: float
    group: int | str
    logprobs: tuple[float, ...] = ()
    weight_version: int = 0


def group_advantages(rollouts: Sequence[Rollout], eps: float = 1e-6) -> list[float]:
    """GRPO advantages: each reward minus its group's mean, divided by the group's std (0 when all equal)."""
    groups: dict[Any, list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(r.group, []).append(i)
    adv = [0.0] * len(rollouts)
    for idx in groups.values():
        rs = [float(rollouts[i].reward) for i in idx]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((x - mean) ** 2 for x in rs) / len(rs))
        for i, x in zip(idx, rs):
            adv[i] = 0.0 if std < eps else (x - mean) / (std + eps)
    return adv


class MegatronTrainer:
    """GRPO-style trainer on the shared megatron-core model (the ``Trainer`` protocol).

    Every entry point runs with this rank's GPU (the model's device, else ``LOCAL_RANK``) as the current CUDA
    device, whatever thread calls it (see :func:`~colo_fsm.adapters.megatron.parallel.device_context`).
    """

    def __init__(
        self, model: Any, config: TrainerConfig | None = None, *, pad_id: int = 0, data_parallel_group: Any = None
    ) -> None:
        self.model = model
        self.config = config or TrainerConfig()
        check_trainable(model.config, allow_inference_optimized_training=self.config.allow_inference_optimized_training)
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.backend = train_backend.resolve_backend(self.config.backend, self.device)
        if self.backend == "megatron" and self.device.type != "cuda":
            raise ConfigError(
                "backend",
                "megatron",
                "'torch' or 'auto' on the CPU (megatron-core's DistributedDataParallel needs CUDA)",
            )
        if self.backend == "torch":
            on = [n for n in (*_MEGATRON_ONLY, "ddp_bucket_size") if getattr(self.config, n) not in (False, None)]
            if on:
                raise ConfigError(
                    on[0], getattr(self.config, on[0]), "unset on the CPU (a megatron-core DDP option; DDP needs CUDA)"
                )
        self._dp_group = data_parallel_group
        self.ddp: Any = None  # megatron-core DistributedDataParallel around the model (megatron backend)
        self.optimizer: Any
        if self.backend == "megatron":
            if data_parallel_group is not None:
                raise ConfigError(
                    "data_parallel_group",
                    data_parallel_group,
                    "None with the megatron backend (DDP uses parallel_state)",
                )
            self.ddp = train_backend.wrap_ddp(model, self.config)
            self.optimizer = train_backend.build_optimizer(self.ddp, self.config)
            train_backend.wire_schedule(self.ddp, self.optimizer, self.config)
        else:
            self.optimizer = torch.optim.AdamW(
                [p for p in model.parameters() if p.requires_grad],
                lr=self.config.lr,
                betas=self.config.betas,
                weight_decay=self.config.weight_decay,
            )
        self.offloaded = False
        self.steps = 0
        self.last_plan: MicroBatchPlan | None = None  # the micro-batches of the last step (for benches and logs)
        self.max_sequence_length = int(getattr(model, "max_sequence_length", 0) or 0)
        # the shared model's inference-only switches (guards); with DDP they include its param-gather hooks
        self.mode = mode_control(self.ddp if self.ddp is not None else model)
        log.info(
            "trainer: backend=%s micro_batch_tokens=%d ddp=%s",
            self.backend,
            self.config.micro_batch_tokens,
            None if self.ddp is None else {k: getattr(self.config, k) for k in (*_MEGATRON_ONLY, "ddp_bucket_size")},
        )

    @property
    def optimizer_shards(self) -> int:
        """The ranks this trainer's optimizer state is sharded over: with megatron's distributed optimizer
        (``use_distributed_optimizer``) the smallest data-parallel group of DDP's buffers (an MoE expert's buffer
        shards over DP / EP ranks, a dense one over DP: the smallest never undercounts), else 1. The engine's
        memory budget takes it as ``MemoryBudget(optimizer_shards=trainer.optimizer_shards)``."""
        if self.ddp is None or not self.config.use_distributed_optimizer:
            return 1
        buffers = [*self.ddp.buffers, *self.ddp.expert_parallel_buffers]
        return min((int(b.data_parallel_world_size) for b in buffers), default=1)

    # ------------------------------------------------------------------ helpers
    def _dp(self) -> tuple[Any, int]:
        import torch.distributed as dist

        if not dist.is_initialized():
            return None, 1
        group = self._dp_group
        if group is None:
            from megatron.core import parallel_state as ps

            if not ps.model_parallel_is_initialized():
                return None, 1
            group = ps.get_data_parallel_group()
        return group, dist.get_world_size(group)

    def _all_reduce_mean(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        group, n = self._dp()
        if n == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t, group=group)
        return (t / n).tolist()

    @on_own_device
    def enter_training_mode(self) -> None:
        """Clear megatron-core's ``InferenceMode`` and put the model in train mode (before any training forward)."""
        from megatron.core.inference.utils import InferenceMode

        if InferenceMode.is_active():
            log.warning("InferenceMode was still set at a training step (engine not suspended?); clearing it")
            InferenceMode.unset_active()
        self.model.train()

    def _batch_tensors(self, rollouts: Sequence[Rollout]) -> dict[str, torch.Tensor]:
        seqs = [list(r.prompt_ids) + list(r.completion_ids) for r in rollouts]
        longest = max(len(s) for s in seqs)
        if self.max_sequence_length and longest > self.max_sequence_length:
            raise ConfigError("rollout length", longest, f"at most max_sequence_length={self.max_sequence_length}")
        b = len(seqs)
        tokens = torch.full((b, longest), self.pad_id, dtype=torch.long)
        valid = torch.zeros((b, longest), dtype=torch.bool)
        comp = torch.zeros((b, longest), dtype=torch.bool)  # positions whose token is a completion token
        old = torch.zeros((b, longest), dtype=torch.float32)
        has_old = all(len(r.logprobs) == len(r.completion_ids) and r.completion_ids for r in rollouts)
        for i, (r, s) in enumerate(zip(rollouts, seqs)):
            off = longest - len(s)  # left padding, as in generation
            tokens[i, off:] = torch.tensor(s, dtype=torch.long)
            valid[i, off:] = True
            start = off + len(r.prompt_ids)
            comp[i, start:] = True
            if has_old:
                old[i, start:] = torch.tensor(r.logprobs, dtype=torch.float32)
        dev = self.device
        return {
            "tokens": tokens.to(dev),
            "valid": valid.to(dev),
            "comp": comp.to(dev),
            "old": old.to(dev),
            "has_old": torch.tensor(has_old),
        }

    def token_logprobs(self, rollouts: Sequence[Rollout]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Log-probs of every completion token under the current weights (``[batch, seq]``, 0 elsewhere)."""
        return self._logprobs(self.model, rollouts)

    def _logprobs(self, model: Any, rollouts: Sequence[Rollout]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        t = self._batch_tensors(rollouts)
        logits = forward_logits(model, t["tokens"], t["valid"]) / self.config.temperature
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, t["tokens"][:, 1:].unsqueeze(2)).squeeze(2)
        logp = torch.nn.functional.pad(logp, (1, 0))  # align: position j holds log p(token_j | < j)
        return logp * t["comp"], t

    @staticmethod
    def _ratio(logp: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """``exp(logp_now - logp_behaviour)`` per completion token (1 elsewhere): the one ratio the loss uses."""
        return torch.exp((logp - t["old"]) * t["comp"])

    @on_own_device
    def importance_ratios(self, rollouts: Sequence[Rollout]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token importance ratios ``pi_now / pi_behaviour`` (``[batch, seq]``, 1 off the completion) and the
        completion mask, exactly as :meth:`train_step` computes them.

        Each token's behaviour log-prob is the one recorded when it was generated (``Rollout.logprobs``), so a
        trajectory parked through a step -- first tokens from one weight version, the rest from the next -- gets
        each token's ratio against the weights that produced it, not against one version recomputed for all.
        Raises ``ConfigError`` unless every rollout has one log-prob per completion token.
        """
        with torch.no_grad():
            logp, t = self.token_logprobs(rollouts)
        if not bool(t["has_old"]):
            raise ConfigError("logprobs", "missing", "one behaviour log-prob per completion token in every rollout")
        return self._ratio(logp, t), t["comp"]

    def _clip_grad_norm(self) -> float:
        """Clip by the global gradient norm of the (tensor-parallel) model and return it.

        Tensor-parallel shards contribute their squares summed over the TP group; replicated parameters
        (layer norms, position embeddings) count once. A purely local norm would give each TP rank its own
        clip factor and make the replicated parameters drift apart across the TP group.
        """
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        grads_tp = [
            p.grad for p in self.model.parameters() if p.grad is not None and getattr(p, "tensor_model_parallel", False)
        ]
        grads_rep = [
            p.grad
            for p in self.model.parameters()
            if p.grad is not None and not getattr(p, "tensor_model_parallel", False)
        ]
        zero = torch.zeros((), dtype=torch.float32, device=self.device)
        sq_tp = sum((g.float().pow(2).sum() for g in grads_tp), zero)
        sq_rep = sum((g.float().pow(2).sum() for g in grads_rep), zero)
        if (
            dist.is_initialized()
            and ps.model_parallel_is_initialized()
            and ps.get_tensor_model_parallel_world_size() > 1
        ):
            dist.all_reduce(sq_tp, group=ps.get_tensor_model_parallel_group())
        total = float((sq_tp + sq_rep).sqrt())
        coef = self.config.grad_clip / (total + 1e-6)
        if coef < 1.0:
            for g in grads_tp + grads_rep:
                g.mul_(coef)
        return total

    def _microbatch_loss(
        self, model: Any, rollouts: Sequence[Rollout], adv: torch.Tensor, n_total: int, acc: dict[str, float]
    ) -> torch.Tensor:
        """The GRPO loss of ``rollouts`` as their share of the whole batch's (sum of per-row token means over
        ``n_total``); adds the micro-batch's clipped and completion token counts to ``acc``. The PPO ratio is
        used when the *whole* batch carries behaviour log-probs (``acc["has_old"]``), as in a one-pass step."""
        logp, t = self._logprobs(model, rollouts)
        comp = t["comp"].float()
        ntok = comp.sum(dim=1).clamp(min=1.0)
        a = adv.unsqueeze(1)
        if acc["has_old"]:
            ratio = self._ratio(logp, t)
            clipped = ratio.clamp(1 - self.config.clip_eps, 1 + self.config.clip_eps)
            per_tok = -torch.minimum(ratio * a, clipped * a)
            acc["clipped"] += float((((ratio - clipped).abs() > 1e-6).float() * comp).sum())
        else:
            per_tok = -(a * logp)
        acc["tokens"] += float(comp.sum())
        return (per_tok * comp).sum(dim=1).div(ntok).sum() / n_total

    def _run_torch(
        self, rollouts: list[Rollout], plan: MicroBatchPlan, adv: torch.Tensor, acc: dict[str, float]
    ) -> float:
        """Micro-batches one after another, then DP all-reduce, clip and AdamW; returns the grad norm."""
        self.optimizer.zero_grad(set_to_none=True)
        for rows in plan.batches:
            loss = self._microbatch_loss(self.model, [rollouts[i] for i in rows], adv[list(rows)], len(rollouts), acc)
            loss.backward()
            acc["loss"] += float(loss.detach())
        group, n = self._dp()
        if n > 1:
            import torch.distributed as dist

            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=group)
                    p.grad.div_(n)
        grad_norm = self._clip_grad_norm()
        self.optimizer.step()
        return grad_norm

    def _run_megatron(
        self, rollouts: list[Rollout], plan: MicroBatchPlan, adv: torch.Tensor, acc: dict[str, float]
    ) -> float:
        """megatron-core's forward-backward schedule over the micro-batches, then its optimizer; returns the
        grad norm. The schedule averages the micro-batch losses, so each is handed over times their count."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        m = len(plan.batches)
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
            rows = next(data_iterator)
            loss = self._microbatch_loss(model, [rollouts[i] for i in rows], adv[list(rows)], len(rollouts), acc)

            def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
                acc["loss"] += float(output.detach())
                return output * m, {"loss": output.detach()}

            return loss, loss_func

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(plan.batches),
            model=self.ddp,
            num_microbatches=m,
            seq_length=max(plan.lengths),
            micro_batch_size=plan.max_micro_batch_size,
            forward_only=False,
        )
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            log.warning("optimizer step skipped (non-finite gradients), step %d", self.steps)
        return float(grad_norm) if grad_norm is not None else float("nan")

    # ------------------------------------------------------------------ Trainer protocol
    @on_own_device
    def train_step(self, batch: Sequence[Rollout]) -> StepResult:
        """One optimizer step on the GRPO loss of ``batch`` (a sequence of :class:`Rollout`), in micro-batches of
        at most ``micro_batch_tokens`` padded tokens."""
        if self.offloaded:
            raise LifecycleError("train_step while training buffers are offloaded; call restore_buffers() first")
        rollouts = list(batch or [])
        if not rollouts or not all(isinstance(r, Rollout) for r in rollouts):
            raise ConfigError("batch", type(batch).__name__, "a non-empty sequence of Rollout")
        lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
        if self.max_sequence_length and max(lengths) > self.max_sequence_length:
            raise ConfigError("rollout length", max(lengths), f"at most max_sequence_length={self.max_sequence_length}")
        check_training_mode(self.mode.report())  # refuse a model some switch still holds in inference mode
        self.enter_training_mode()
        plan = self.last_plan = plan_microbatches(lengths, self.config.micro_batch_tokens)
        adv = torch.tensor(group_advantages(rollouts), dtype=torch.float32, device=self.device)
        has_old = all(len(r.logprobs) == len(r.completion_ids) and r.completion_ids for r in rollouts)
        acc = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0, "has_old": float(has_old)}
        if self.backend == "megatron":
            grad_norm = self._run_megatron(rollouts, plan, adv, acc)
        else:
            grad_norm = self._run_torch(rollouts, plan, adv, acc)
        self.model.eval()  # generation reads these weights next; no dropout there
        self.steps += 1
        rewards = [float(r.reward) for r in rollouts]
        clip_frac = acc["clipped"] / max(acc["tokens"], 1.0)
        loss_v, reward_mean, clip_v = self._all_reduce_mean([acc["loss"], sum(rewards) / len(rewards), clip_frac])
        metrics = {
            "train/loss": loss_v,
            "train/reward_mean": reward_mean,
            "train/grad_norm": grad_norm,
            "train/clip_frac": clip_v,
            "train/completion_tokens": acc["tokens"],
            "train/micro_batches": float(len(plan.batches)),
            "train/padded_tokens": float(plan.padded_tokens),
        }
        return StepResult(metrics=metrics, consumed_samples=len(rollouts))

    @on_own_device
    def offload_buffers(self) -> None:
        """Free gradients (megatron: DDP's grad buffers); with ``offload_optimizer_state`` on CUDA, move the
        optimizer state to pinned host memory."""
        for p in self.model.parameters():
            p.grad = None
        if self.ddp is not None:
            self.ddp.offload_grad_buffers()
        if self.config.offload_optimizer_state and self.device.type == "cuda":
            for opt in train_backend.torch_optimizers(self.optimizer):
                for st in opt.state.values():
                    for k, v in st.items():
                        if torch.is_tensor(v) and v.is_cuda:
                            st[k] = v.to("cpu", non_blocking=True).pin_memory()
            torch.cuda.empty_cache()
        self.offloaded = True

    @on_own_device
    def restore_buffers(self) -> None:
        """Bring optimizer state (and DDP's grad buffers) back to the device (gradients are re-created by the
        next backward)."""
        if self.ddp is not None:
            self.ddp.restore_grad_buffers()
        if self.config.offload_optimizer_state and self.device.type == "cuda":
            for opt in train_backend.torch_optimizers(self.optimizer):
                for st in opt.state.values():
                    for k, v in st.items():
                        if torch.is_tensor(v) and not v.is_cuda and k != "step":
                            st[k] = v.to(self.device, non_blocking=True)
        self.offloaded = False

    @on_own_device
    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        """Save model, optimizer and ``extra_state`` atomically under ``config.checkpoint_dir``."""
        if not self.config.checkpoint_dir:
            raise ConfigError("checkpoint_dir", self.config.checkpoint_dir, "a directory to save checkpoints in")
        restore = self.offloaded and self.config.offload_optimizer_state and self.device.type == "cuda"
        if restore:
            self.restore_buffers()
        try:
            save_checkpoint(
                self.config.checkpoint_dir,
                step=step,
                weight_version=weight_version,
                model=self.model,
                optimizer=self.optimizer,
                extra_state=extra_state,
                checkpoint_format=self.config.checkpoint_format,
            )
        finally:
            if restore:
                self.offload_buffers()

    @on_own_device
    def load_checkpoint(self, path: str | Path | None = None) -> CheckpointInfo:
        """Load the latest checkpoint under ``config.checkpoint_dir`` (or ``path``) into model and optimizer."""
        target = path or self.config.checkpoint_dir
        if not target:
            raise ConfigError("checkpoint_dir", target, "a directory holding checkpoints")
        info = load_checkpoint(target, model=self.model, optimizer=self.optimizer)
        self.model.eval()
        return info


__all__ = ["MegatronTrainer", "Rollout", "TrainerConfig", "group_advantages"]
