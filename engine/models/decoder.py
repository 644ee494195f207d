"""The decoder stack: :class:`DecoderLayer` and :class:`CausalLM`, shared by every family.

A step is a flattened varlen batch (no padding): ``T`` tokens of several sequences with their
absolute positions; per-sequence boundaries and KV slots live in :class:`AttentionMetadata`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.attention import Attention
from engine.models.config import ModelArchConfig
from engine.models.layers import Embedding, GatedMLP, Linear, RMSNorm
from engine.models.moe import MoELayer
from engine.models.rope import RotaryEmbedding


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))``; ``mlp`` is dense or MoE."""

    def __init__(
        self,
        config: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        expert_ids: Sequence[int] | None,
    ) -> None:
        super().__init__()
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(hidden, eps, dtype=dtype, device=device)
        self.self_attn = Attention(
            config, backend, dtype=dtype, device=device, window=config.layer_window(layer_idx)
        )
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype=dtype, device=device)
        self.mlp: nn.Module  # GatedMLP or MoELayer (or an expert-parallel wrapper of it)
        if config.is_moe_layer(layer_idx):
            self.mlp = MoELayer(config, dtype=dtype, device=device, expert_ids=expert_ids)
        else:
            self.mlp = GatedMLP(hidden, config.intermediate_size, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, H]
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,  # [T, 1, D] (signed)
        layer_kv: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        """One decoder layer over the step's tokens."""
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, layer_kv, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class CausalLM(nn.Module):
    """A decoder-only LM over a paged KV cache; ``forward`` returns final-norm hidden states.

    ``expert_ids`` (MoE only) lists the global expert ids this instance owns in every MoE layer;
    None means all of them.
    """

    def __init__(
        self,
        config: ModelArchConfig,
        backend: AttentionBackend,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        expert_ids: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device
        )
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, dtype, device
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, backend, dtype=dtype, device=device, expert_ids=expert_ids)
            for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        self.lm_head: Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = Linear(
                config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
            )

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_cache: torch.Tensor,  # [num_blocks, num_layers, 2, block_size, num_kv_heads, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        """Run the step's tokens through every layer, writing their K/V into ``kv_cache``."""
        cos, sin = self.rotary(positions)  # [T, 1, D] each
        hidden = self.embed_tokens(input_ids)  # [T, H]
        for layer_idx, layer in enumerate(self.layers):
            hidden = layer(hidden, cos, sin, kv_cache[:, layer_idx], meta)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] hidden states -> [N, vocab] float32 logits."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
