"""The training side of the shared model: a GRPO-style policy-gradient step with AdamW (``Trainer``).

Optimizer choice: ``torch.optim.AdamW`` with an explicit data-parallel gradient all-reduce, not
megatron-core's ``DistributedDataParallel`` + ``get_megatron_optimizer``. Megatron's DDP and optimizer
wrappers assume CUDA (streams, ``torch.cuda.synchronize``, contiguous CUDA grad buffers), so they cannot run
on the CPU path, and a tiny policy gains nothing from a distributed optimizer. With one plain optimizer the
CPU and GPU paths share every line; checkpoints still go through megatron-core's ``dist_checkpointing``
(optimizer state mapped onto the model's sharded tensors), so they are TP-aware.

Offload: :meth:`MegatronTrainer.offload_buffers` frees every gradient (``param.grad = None``) and, with
``offload_optimizer_state=True`` on CUDA, moves AdamW state to pinned host memory; parameters are never
moved: generation reads them in place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from colo_fsm.adapters.megatron.checkpoint import FORMATS, CheckpointInfo, load_checkpoint, save_checkpoint
from colo_fsm.adapters.megatron.cpu_loop import forward_logits
from colo_fsm.adapters.megatron.mode import mode_control
from colo_fsm.adapters.megatron.model import check_trainable
from colo_fsm.adapters.megatron.parallel import on_own_device
from colo_fsm.adapters.protocols import StepResult
from colo_fsm.errors import ConfigError, LifecycleError
from colo_fsm.guards.mode import check_training_mode
from colo_fsm.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class TrainerConfig:
    """Optimizer and loss settings. ``clip_eps`` is the PPO-style ratio clip (used when rollouts carry the
    behaviour policy's log-probs); ``checkpoint_dir`` is where :meth:`MegatronTrainer.save_checkpoint` writes.
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
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=self.config.lr,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
        )
        self._dp_group = data_parallel_group
        self.offloaded = False
        self.steps = 0
        self.max_sequence_length = int(getattr(model, "max_sequence_length", 0) or 0)
        self.mode = mode_control(model)  # the shared model's inference-only switches (guards)

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
        t = self._batch_tensors(rollouts)
        logits = forward_logits(self.model, t["tokens"], t["valid"]) / self.config.temperature
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

    # ------------------------------------------------------------------ Trainer protocol
    @on_own_device
    def train_step(self, batch: Sequence[Rollout]) -> StepResult:
        """One AdamW step on the GRPO loss of ``batch`` (a sequence of :class:`Rollout`)."""
        if self.offloaded:
            raise LifecycleError("train_step while training buffers are offloaded; call restore_buffers() first")
        rollouts = list(batch or [])
        if not rollouts or not all(isinstance(r, Rollout) for r in rollouts):
            raise ConfigError("batch", type(batch).__name__, "a non-empty sequence of Rollout")
        check_training_mode(self.mode.report())  # refuse a model some switch still holds in inference mode
        self.enter_training_mode()
        adv = torch.tensor(group_advantages(rollouts), dtype=torch.float32, device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        logp, t = self.token_logprobs(rollouts)
        comp = t["comp"].float()
        ntok = comp.sum(dim=1).clamp(min=1.0)
        a = adv.unsqueeze(1)
        if bool(t["has_old"]):
            ratio = self._ratio(logp, t)
            clipped = ratio.clamp(1 - self.config.clip_eps, 1 + self.config.clip_eps)
            per_tok = -torch.minimum(ratio * a, clipped * a)
            clip_frac = float((((ratio - clipped).abs() > 1e-6).float() * comp).sum() / comp.sum().clamp(min=1))
        else:
            per_tok = -(a * logp)
            clip_frac = 0.0
        loss = ((per_tok * comp).sum(dim=1) / ntok).mean()
        loss.backward()
        group, n = self._dp()
        if n > 1:
            import torch.distributed as dist

            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=group)
                    p.grad.div_(n)
        grad_norm = self._clip_grad_norm()
        self.optimizer.step()
        self.model.eval()  # generation reads these weights next; no dropout there
        self.steps += 1
        rewards = [float(r.reward) for r in rollouts]
        loss_v, reward_mean, clip_v = self._all_reduce_mean(
            [float(loss.detach()), sum(rewards) / len(rewards), clip_frac]
        )
        metrics = {
            "train/loss": loss_v,
            "train/reward_mean": reward_mean,
            "train/grad_norm": grad_norm,
            "train/clip_frac": clip_v,
            "train/completion_tokens": float(comp.sum()),
        }
        return StepResult(metrics=metrics, consumed_samples=len(rollouts))

    @on_own_device
    def offload_buffers(self) -> None:
        """Free gradients; with ``offload_optimizer_state`` on CUDA, move AdamW state to pinned host memory."""
        for p in self.model.parameters():
            p.grad = None
        if self.config.offload_optimizer_state and self.device.type == "cuda":
            for st in self.optimizer.state.values():
                for k, v in st.items():
                    if torch.is_tensor(v) and v.is_cuda:
                        st[k] = v.to("cpu", non_blocking=True).pin_memory()
            torch.cuda.empty_cache()
        self.offloaded = True

    @on_own_device
    def restore_buffers(self) -> None:
        """Bring optimizer state back to the device (gradients are re-created by the next backward)."""
        if self.config.offload_optimizer_state and self.device.type == "cuda":
            for st in self.optimizer.state.values():
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
