"""Triton paged-attention kernels against the torch backend on CUDA, at serving-sized shapes."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.paged_batches import compare

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# (num_heads, num_kv_heads, head_dim): GQA 4, MHA, MQA, a group of 7, a non-power-of-2 head_dim
SHAPES = [(32, 8, 128), (16, 16, 64), (16, 1, 128), (28, 4, 128), (8, 2, 80)]
SHAPE_IDS = [f"{h}q-{kv}kv-d{d}" for h, kv, d in SHAPES]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]


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
