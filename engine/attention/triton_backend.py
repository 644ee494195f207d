"""Paged attention through Triton kernels: the default backend on CUDA.

Each step runs the cache-write kernel (or, for a model with fused kernels, the RoPE + cache-write
kernel, through :meth:`TritonAttentionBackend.forward_rope`), then either the paged decode kernel
(every sequence has one new token) or the varlen prefill kernel (prefill chunks, prefix hits and
any decodes mixed in). A step of whole fresh prompts (nothing cached before them) needs no
paging: its prompts read their K/V back from the cache and run PyTorch's SDPA, whose CUDA
kernels (FlashAttention, cuDNN) are tuned per GPU generation. On CPU the kernels only run in
Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is first imported), which is for
testing, not serving.
"""

from __future__ import annotations

import torch

from core.errors import ConfigError
from engine.attention.backend import register_backend
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import attend_fresh_prompts, is_fresh_prompts
from engine.attention.triton_kernels import (
    interpreter_active,
    paged_decode_attention,
    paged_prefill_attention,
    rope_and_write_kv_cache,
    write_kv_cache,
)


class TritonAttentionBackend:
    """Paged attention with Triton kernels; needs CUDA, or the interpreter on CPU."""

    name = "triton"
    supports_cuda_graphs = True  # grids from the batch size, lengths read inside the kernels

    def __init__(self) -> None:
        if not torch.cuda.is_available() and not interpreter_active():
            raise ConfigError(
                "attention backend 'triton' needs CUDA (or TRITON_INTERPRET=1 set before triton "
                "is imported, for testing); use 'torch' on CPU",
                param="attention_backend",
            )

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Write the new K/V at ``meta.slot_mapping``, then attend causally over each context
        (within the last ``window`` positions when given)."""
        write_kv_cache(kv_cache, k, v, meta.slot_mapping)
        return self._attend(q, kv_cache, meta, scale, window)

    def forward_rope(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim], not yet rotated
        k: torch.Tensor,  # [T, num_kv_heads, head_dim], not yet rotated
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,  # [T, 1, head_dim] (signed)
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Rotate q and k and write k/v in one kernel, then attend as :meth:`forward` does."""
        q = rope_and_write_kv_cache(kv_cache, q, k, v, cos, sin, meta.slot_mapping)
        return self._attend(q, kv_cache, meta, scale, window)

    def _attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim], rotated
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        if is_fresh_prompts(meta, window):
            return attend_fresh_prompts(q, kv_cache, meta, scale)
        out = torch.empty_like(q)
        if meta.num_seqs == 0:
            return out
        if meta.decode_only:
            paged_decode_attention(
                out, q, kv_cache, meta.block_tables, meta.seq_lens, scale, window=window
            )
        else:
            paged_prefill_attention(
                out,
                q,
                kv_cache,
                meta.block_tables,
                meta.seq_lens,
                meta.query_start_loc,
                meta.max_query_len,
                scale,
                window=window,
            )
        return out


register_backend("triton", TritonAttentionBackend)
