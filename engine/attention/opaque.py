"""Paged attention as one opaque custom op, so ``torch.compile`` can take the rest of the model.

Attention is the one part of a step whose work depends on host-side metadata: per-sequence
lengths, block tables, prefix/decode routing. Traced by dynamo, those Python values would become
guards and recompile the model at every step. Instead the whole attention call (KV write plus
attention) is the custom op ``pdserve::paged_attention``: the compiler sees the new tokens' q, k
and v in and a tensor out, and fuses everything around it (norms, RoPE, residuals, MLP) into
generated kernels. The step's metadata, the KV cache and the real backend reach the op through
:func:`attention_step`, not through the graph (as vLLM's forward context does): a KV cache that
is a graph input and written by an op gets functionalised — the op writes a copy.

:class:`OpaqueAttention` is the backend each layer of a compiled model holds: it calls the op
with its layer index, and the op runs the configured backend (torch on CPU, Triton on CUDA) on
that layer's cache. A model with fused kernels calls ``pdserve::paged_attention_rope`` instead,
which hands the backend q and k before RoPE (:class:`~engine.attention.backend.RopeFusingBackend`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend, RopeFusingBackend
from engine.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class _Step:
    backend: AttentionBackend
    kv_cache: torch.Tensor  # [num_blocks, L, 2, block_size, Hkv, D]
    meta: AttentionMetadata


_ACTIVE: ContextVar[_Step | None] = ContextVar("pdserve_attention_step", default=None)


@contextmanager
def attention_step(
    backend: AttentionBackend, kv_cache: torch.Tensor, meta: AttentionMetadata
) -> Iterator[None]:
    """Make ``backend``, the cache and this step's ``meta`` what the op uses meanwhile."""
    token = _ACTIVE.set(_Step(backend, kv_cache, meta))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@torch.library.custom_op("pdserve::paged_attention", mutates_args=())
def paged_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    layer_idx: int,
    scale: float,
    window: int = 0,
) -> torch.Tensor:  # [T, num_heads, head_dim] contiguous
    """The active step's backend on layer ``layer_idx`` (sliding ``window`` when > 0); only
    valid inside :func:`attention_step`.

    Writes ``k``/``v`` into the step's cache: a side effect the compiler is not told about, which
    is safe because nothing in the graph reads the cache (only this op does, in layer order).
    """
    step = _ACTIVE.get()
    if step is None:
        raise RuntimeError("pdserve::paged_attention called outside an attention_step()")
    layer_kv = step.kv_cache[:, layer_idx]
    return step.backend.forward(q, k, v, layer_kv, step.meta, scale, window or None).contiguous()


@paged_attention.register_fake
def _paged_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer_idx: int,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    return q.new_empty(q.shape)


@torch.library.custom_op("pdserve::paged_attention_rope", mutates_args=())
def paged_attention_rope(
    q: torch.Tensor,  # [T, num_heads, head_dim], not yet rotated
    k: torch.Tensor,  # [T, num_kv_heads, head_dim], not yet rotated
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [T, 1, head_dim]
    sin: torch.Tensor,  # [T, 1, head_dim] (signed)
    layer_idx: int,
    scale: float,
    window: int = 0,
) -> torch.Tensor:  # [T, num_heads, head_dim] contiguous
    """:func:`paged_attention` with RoPE applied by the backend (which must fuse it)."""
    step = _ACTIVE.get()
    if step is None:
        raise RuntimeError("pdserve::paged_attention_rope called outside an attention_step()")
    if not isinstance(step.backend, RopeFusingBackend):
        raise RuntimeError(f"attention backend {step.backend.name!r} cannot fuse RoPE")
    layer_kv = step.kv_cache[:, layer_idx]
    out = step.backend.forward_rope(q, k, v, cos, sin, layer_kv, step.meta, scale, window or None)
    return out.contiguous()


@paged_attention_rope.register_fake
def _paged_attention_rope_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layer_idx: int,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    return q.new_empty(q.shape)


class OpaqueAttention:
    """The :class:`AttentionBackend` of one layer of a compiled model: calls the custom op.

    ``kv_cache`` and ``meta`` are ignored here (a compiled model is called with ``meta=None``);
    the op takes both from :func:`attention_step`.
    """

    name = "opaque"
    supports_cuda_graphs = False  # decided by the real backend behind the op, not here

    def __init__(self, layer_idx: int) -> None:
        self.layer_idx = layer_idx

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata | None,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """``pdserve::paged_attention(q, k, v, layer_idx, scale, window)``."""
        return paged_attention(q, k, v, self.layer_idx, scale, window or 0)

    def forward_rope(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata | None,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """``pdserve::paged_attention_rope(q, k, v, cos, sin, layer_idx, scale, window)``."""
        return paged_attention_rope(q, k, v, cos, sin, self.layer_idx, scale, window or 0)
