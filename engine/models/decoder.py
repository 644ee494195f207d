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
from engine.models.kernels import TORCH_KERNELS, ModelKernels, default_fused, model_kernels
from engine.models.layers import Embedding, GatedMLP, Linear, RMSNorm
from engine.models.moe import MoELayer
from engine.models.rope import RotaryEmbedding
from engine.models.tp_shard import TPShard
from engine.models.tp_split import check_tensor_parallel


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))``; ``mlp`` is dense or MoE.

    The residual stream travels beside the block's output (vLLM's convention): a layer returns
    ``(mlp_out, residual)`` and the next layer's first norm adds the two, so each residual add
    fuses into the norm that follows it. The sums are the same as ``h + attn(...)``'s.
    """

    def __init__(
        self,
        config: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        expert_ids: Sequence[int] | None,
        kernels: ModelKernels = TORCH_KERNELS,
        tp: TPShard | None = None,
    ) -> None:
        super().__init__()
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(hidden, eps, dtype=dtype, device=device, kernels=kernels)
        self.self_attn = Attention(
            config,
            backend,
            dtype=dtype,
            device=device,
            window=config.layer_window(layer_idx),
            kernels=kernels,
            tp=tp,
        )
        self.post_attention_layernorm = RMSNorm(
            hidden, eps, dtype=dtype, device=device, kernels=kernels
        )
        self.mlp: nn.Module  # GatedMLP or MoELayer (or an expert-parallel wrapper of it)
        if config.is_moe_layer(layer_idx):
            self.mlp = MoELayer(
                config,
                dtype=dtype,
                device=device,
                expert_ids=expert_ids,
                kernels=kernels,
                tp=tp,
            )
        else:
            self.mlp = GatedMLP(
                hidden,
                config.intermediate_size,
                dtype=dtype,
                device=device,
                kernels=kernels,
                tp=tp,
            )

    def forward(
        self,
        hidden: torch.Tensor,  # [T, H]
        residual: torch.Tensor | None,  # [T, H]; None in the first layer
        cos: torch.Tensor,  # [T, 1, D]
        sin: torch.Tensor,  # [T, 1, D] (signed)
        layer_kv: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, D]
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H], [T, H])
        """One decoder layer over the step's tokens: ``(mlp output, residual)``, whose sum is
        the layer's output hidden states."""
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden)
        else:
            normed, residual = self.input_layernorm.add_and_norm(hidden, residual)
        attn_out = self.self_attn(normed, cos, sin, layer_kv, meta)  # [T, H]
        normed, residual = self.post_attention_layernorm.add_and_norm(attn_out, residual)
        return self.mlp(normed), residual


class CausalLM(nn.Module):
    """A decoder-only LM over a paged KV cache; ``forward`` returns final-norm hidden states.

    ``expert_ids`` (MoE only) lists the global expert ids this instance owns in every MoE layer;
    None means all of them. ``fused_kernels`` picks the Triton kernels for norms, activation,
    RoPE and MoE experts (:mod:`engine.models.kernels`); None takes them on CUDA only. ``tp``:
    this model is one rank of a tensor-parallel gang and holds that rank's slices
    (:mod:`engine.models.tp_shard`); its KV cache holds the rank's KV heads.
    """

    def __init__(
        self,
        config: ModelArchConfig,
        backend: AttentionBackend,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        expert_ids: Sequence[int] | None = None,
        fused_kernels: bool | None = None,
        tp: TPShard | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.tp = tp
        if tp is not None:
            check_tensor_parallel(config, tp.size)
        fused = default_fused(device) if fused_kernels is None else fused_kernels
        self.kernels = model_kernels(fused)
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, device=device, tp=tp
        )
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, dtype, device
        )
        self.layers = nn.ModuleList(
            DecoderLayer(
                config,
                i,
                backend,
                dtype=dtype,
                device=device,
                expert_ids=expert_ids,
                kernels=self.kernels,
                tp=tp,
            )
            for i in range(config.num_layers)
        )
        self.norm = RMSNorm(
            config.hidden_size,
            config.rms_norm_eps,
            dtype=dtype,
            device=device,
            kernels=self.kernels,
        )
        self.lm_head: Linear | None = None
        if not config.tie_word_embeddings:  # vocabulary-sliced like the embedding under TP
            rows = self.embed_tokens.weight.shape[0]
            self.lm_head = Linear(config.hidden_size, rows, bias=False, dtype=dtype, device=device)
            self.lm_head.weight.data[self.embed_tokens.num_ids :].zero_()

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
        residual: torch.Tensor | None = None
        for layer_idx, layer in enumerate(self.layers):
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache[:, layer_idx], meta)
        if residual is None:  # a model without layers
            return self.norm(hidden)
        return self.norm.add_and_norm(hidden, residual)[0]

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Shape of this model's block-major KV tensor: its own KV heads under TP."""
        shape = self.config.kv_cache_shape(num_blocks, block_size)
        if self.tp is None:
            return shape
        return (*shape[:4], self.tp.kv_heads(self.config.num_kv_heads)[1], shape[5])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] hidden states -> [N, vocab] float32 logits (gathered over a TP gang)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden, weight).float()  # [N, vocab rows of this rank]
        return logits if self.tp is None else self.tp.gather_vocab(logits, self.config.vocab_size)
