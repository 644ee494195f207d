"""Random paged batches on CUDA and the Triton-vs-torch comparison the kernel tests share."""

from __future__ import annotations

import random

import torch

from engine.attention import AttentionMetadata, TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend

DEVICE = "cuda"
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    block_size: int = 16,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Random q/k/v, a random 2-layer block-major cache and shuffled block tables."""
    num_heads, num_kv_heads, head_dim = shape
    rng = random.Random(seed)
    torch.manual_seed(seed)
    counts = [-(-s // block_size) for s in seq_lens]
    block_ids = list(range(sum(counts) + 7))
    rng.shuffle(block_ids)
    tables = []
    for count in counts:
        tables.append(block_ids[:count])
        block_ids = block_ids[count:]
    num_blocks = sum(counts) + 7
    kv = torch.randn(
        num_blocks, 2, 2, block_size, num_kv_heads, head_dim, device=DEVICE, dtype=dtype
    )
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, device=DEVICE, dtype=dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE, dtype=dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE, dtype=dtype)
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size, device=DEVICE)
    return q, k, v, kv, meta


def compare(
    query_lens: list[int],
    seq_lens: list[int],
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    block_size: int = 16,
    seed: int = 0,
) -> None:
    """Triton backend == torch backend: the same cache writes, outputs within tolerance."""
    q, k, v, kv, meta = make_batch(query_lens, seq_lens, shape, dtype, block_size, seed)
    torch_kv = kv.clone()
    scale = shape[2] ** -0.5
    expected = TorchAttentionBackend().forward(q, k, v, torch_kv[:, 1], meta, scale)
    out = TritonAttentionBackend().forward(q, k, v, kv[:, 1], meta, scale)
    torch.cuda.synchronize()
    context = f"seed={seed} shape={shape} dtype={dtype} block_size={block_size}"
    assert torch.equal(kv, torch_kv), f"cache writes differ ({context})"
    torch.testing.assert_close(
        out,
        expected,
        atol=TOLERANCE[dtype],
        rtol=TOLERANCE[dtype],
        msg=lambda m: f"{m} ({context})",
    )
