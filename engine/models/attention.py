"""The attention block of a decoder layer: fused QKV projection, optional per-head q/k RMSNorm
(Qwen3), RoPE, paged attention through an :class:`AttentionBackend`, output projection.

With fused kernels and a backend that can (:class:`RopeFusingBackend`), RoPE moves into the
backend's KV-cache write: the block hands it q and k before rotation, with the cos/sin tables.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from engine.attention.backend import AttentionBackend, RopeFusingBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.config import ModelArchConfig
from engine.models.kernels import TORCH_KERNELS, ModelKernels
from engine.models.layers import Linear, RMSNorm
from engine.models.rope import apply_rope
from engine.models.tp_shard import TPShard


class Attention(nn.Module):
    """Multi-head attention with GQA/MQA over one layer's paged KV cache.

    ``qkv_proj.weight`` stacks the checkpoint's q, k and v projections as rows
    ``[q (num_heads * D); k (num_kv_heads * D); v (num_kv_heads * D)]``.
    """

    def __init__(
        self,
        config: ModelArchConfig,
        backend: AttentionBackend,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        window: int | None = None,
        kernels: ModelKernels = TORCH_KERNELS,
        tp: TPShard | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.tp = tp
        # decided once: a compiled model later swaps in an opaque backend that forwards either way
        self.fuse_rope = kernels.fused and isinstance(backend, RopeFusingBackend)
        self.window = window  # sliding-window attention over the last `window` positions
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        if tp is not None:  # this rank's query heads and the KV heads they read
            self.num_heads = tp.heads(config.num_heads)[1]
            self.num_kv_heads = tp.kv_heads(config.num_kv_heads)[1]
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        num_qkv_heads = self.num_heads + 2 * self.num_kv_heads
        self.qkv_proj = Linear(
            config.hidden_size,
            num_qkv_heads * config.head_dim,
            bias=config.qkv_bias,
            dtype=dtype,
            device=device,
        )
        self.o_proj = Linear(
            self.num_heads * config.head_dim,
            config.hidden_size,
            # row-parallel: the bias is added once, by rank 0, before the partial sums meet
            bias=config.o_bias and (tp is None or tp.rank == 0),
            dtype=dtype,
            device=device,
        )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            eps = config.rms_norm_eps
            self.q_norm = RMSNorm(config.head_dim, eps, dtype=dtype, device=device, kernels=kernels)
            self.k_norm = RMSNorm(config.head_dim, eps, dtype=dtype, device=device, kernels=kernels)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, H]
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,  # [T, 1, D] (signed)
        layer_kv: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        """Attend the step's tokens over their sequences' cached + new context."""
        num_tokens = hidden.shape[0]
        nh, nkv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(hidden).view(num_tokens, nh + 2 * nkv, self.head_dim)  # [T, n, D]
        q, k, v = qkv[:, :nh], qkv[:, nh : nh + nkv], qkv[:, nh + nkv :]  # [T, nh|nkv, D]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, before RoPE
        if self.fuse_rope:
            backend = cast(RopeFusingBackend, self.backend)
            out = backend.forward_rope(q, k, v, cos, sin, layer_kv, meta, self.scale, self.window)
        else:
            if self.q_norm is None:  # q and k are adjacent heads of qkv: one rotation
                qk = apply_rope(qkv[:, : nh + nkv], cos, sin)  # [T, nh + nkv, D]
                q, k = qk[:, :nh], qk[:, nh:]
            else:
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            out = self.backend.forward(q, k, v, layer_kv, meta, self.scale, self.window)
        projected = self.o_proj(out.reshape(num_tokens, nh * self.head_dim))  # out: [T, nh, D]
        return projected if self.tp is None else self.tp.all_reduce(projected)
