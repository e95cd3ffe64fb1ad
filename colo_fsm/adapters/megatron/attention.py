"""A core-attention module on ``torch.nn.functional.scaled_dot_product_attention``.

megatron-core's local ``DotProductAttention`` allocates scratch on ``torch.cuda.current_device()``, so a
CUDA-build torch on a machine without a GPU cannot run it. The layer spec is megatron-core's extension
point: :func:`colo_fsm.adapters.megatron.model.build_model` puts :class:`SDPAttention` at
``spec.submodules.self_attention.submodules.core_attention``. Same constructor and forward signature as
``DotProductAttention``; nothing in torch or megatron-core is patched.

The attention kernel is picked among flash, memory-efficient and math (:data:`SDPA_BACKENDS`), never cuDNN's:
on one H200 (torch 2.11, bf16, boolean padding mask) cuDNN attention built a plan for every new sequence length,
0.2-2.5 s inside the first train step that saw it, where the others cost nothing extra; with heavy-tailed
rollout lengths almost every step has a new length. torch's backend flags are process-wide: while the engine
thread and a training thread overlap, one call may see the other's restored flags (it can then pick cuDNN once).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from torch.nn.attention import SDPBackend, sdpa_kernel

SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
"""The kernels :class:`SDPAttention` may use (torch picks the fastest that supports the inputs)."""


class SDPAttention(MegatronModule):
    """Causal (or masked) attention over q/k/v of shape ``[seq, batch, heads, dim]``, output ``[seq, batch,
    heads*dim]``. A boolean ``attention_mask`` follows megatron-core's convention: True means *masked out*."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if getattr(config, "context_parallel_size", 1) != 1:
            raise ValueError("SDPAttention does not support context parallelism")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.dropout_p = float(config.attention_dropout if attention_dropout is None else attention_dropout)
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """Attend; q/k/v are ``[seq, batch, heads, dim]`` (k/v may have fewer heads: grouped-query attention)."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention supports neither packed sequences nor an attention bias")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        if k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        mask_type = attn_mask_type or self.attn_mask_type
        mask = None
        causal = mask_type == AttnMaskType.causal
        if attention_mask is not None:
            mask = ~attention_mask.to(torch.bool)  # SDPA: True means "may attend"
            causal = False  # the caller's mask already encodes causality
        with sdpa_kernel(list(SDPA_BACKENDS)):
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=self.dropout_p if self.training else 0.0,
                is_causal=causal,
                scale=self.softmax_scale,
            )
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


__all__ = ["SDPA_BACKENDS", "SDPAttention"]
