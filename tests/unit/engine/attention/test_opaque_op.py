"""``pdserve::paged_attention``: the opaque op a compiled model calls, against the backend."""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttentionBackend
from engine.attention.opaque import OpaqueAttention, attention_step, paged_attention


def test_the_op_runs_the_step_backend_on_its_layer_and_writes_the_cache() -> None:
    torch.manual_seed(0)
    num_blocks, layers, block_size, kv_heads, head_dim = 6, 3, 4, 2, 8
    cache = torch.randn(num_blocks, layers, 2, block_size, kv_heads, head_dim)
    reference = cache.clone()
    # two sequences: 3 cached + 2 new tokens (blocks 1, 4), 6 new tokens (blocks 2, 5)
    meta = AttentionMetadata.build([2, 6], [5, 6], [[1, 4], [2, 5]], block_size)
    q = torch.randn(8, 4, head_dim)
    k, v = torch.randn(8, kv_heads, head_dim), torch.randn(8, kv_heads, head_dim)
    backend = TorchAttentionBackend()

    with attention_step(backend, cache, meta):
        out = OpaqueAttention(layer_idx=2).forward(q, k, v, cache[:, 0], None, 0.5)
    expected = TorchAttentionBackend().forward(q, k, v, reference[:, 2], meta, 0.5)

    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out.is_contiguous()
    torch.testing.assert_close(cache, reference, rtol=0, atol=0)  # layer 2 written, 0 and 1 kept


def test_the_op_outside_a_step_is_an_error() -> None:
    q = torch.zeros(1, 2, 4)
    with pytest.raises(RuntimeError, match="outside an attention_step"):
        paged_attention(q, q[:, :1], q[:, :1], 0, 1.0)
