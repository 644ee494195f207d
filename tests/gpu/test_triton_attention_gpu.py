"""Triton paged-attention kernels against the torch backend on CUDA, at serving-sized shapes."""

from __future__ import annotations

import random

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DEVICE = "cuda"
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}
# (num_heads, num_kv_heads, head_dim): GQA 4, MHA, MQA, a group of 7, a non-power-of-2 head_dim
SHAPES = [(32, 8, 128), (16, 16, 64), (16, 1, 128), (28, 4, 128), (8, 2, 80)]
SHAPE_IDS = [f"{h}q-{kv}kv-d{d}" for h, kv, d in SHAPES]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    block_size: int = 16,
    seed: int = 0,
) -> tuple[torch.Tensor, ...]:
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


def compare(query_lens: list[int], seq_lens: list[int], shape, dtype, block_size=16) -> None:
    q, k, v, kv, meta = make_batch(query_lens, seq_lens, shape, dtype, block_size)
    torch_kv = kv.clone()
    scale = shape[2] ** -0.5
    expected = TorchAttentionBackend().forward(q, k, v, torch_kv[:, 1], meta, scale)
    out = TritonAttentionBackend().forward(q, k, v, kv[:, 1], meta, scale)
    torch.cuda.synchronize()
    assert torch.equal(kv, torch_kv)
    torch.testing.assert_close(out, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_decode_matches_torch_backend(shape, dtype) -> None:
    seq_lens = [1, 15, 16, 17, 255, 1000, 2049, 4000] * 2
    compare([1] * len(seq_lens), seq_lens, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_prefill_over_prefix_matches_torch_backend(shape, dtype) -> None:
    # prefix hit, chunk of a long prompt, fresh prompts, decodes mixed in
    compare([512, 300, 1, 64, 1, 777], [2012, 300, 90, 64, 4000, 777], shape, dtype)


@pytest.mark.parametrize("block_size", [1, 8, 32, 128])
def test_block_sizes(block_size) -> None:
    compare([1, 1, 1], [100, 1, 3000], (32, 8, 128), torch.bfloat16, block_size)
    compare([100, 40], [100, 1000], (32, 8, 128), torch.bfloat16, block_size)
