"""Triton kernels against the torch reference on fresh random inputs every run (bf16, fp16):
GQA and MQA layouts, several block sizes, random batch mixes and long contexts.

Each test draws its seed from the OS; a failure message names it, so
``compare(..., seed=<that seed>)`` reproduces the exact batch.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.gpu.helpers import fresh_seed
from tests.gpu.paged_batches import compare

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# (num_heads, num_kv_heads, head_dim): llama-1b (GQA 4, d64), Llama-3-8B (GQA 4, d128),
# MQA, a group of 7 (Qwen2-7B-like)
SHAPES = [(32, 8, 64), (32, 8, 128), (16, 1, 128), (28, 4, 128)]
SHAPE_IDS = [f"{h}q-{kv}kv-d{d}" for h, kv, d in SHAPES]
DTYPES = [torch.bfloat16, torch.float16]
DTYPE_IDS = ["bf16", "fp16"]
BLOCK_SIZES = [8, 16, 64]


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_decode_on_random_batches(shape, dtype, block_size) -> None:
    seed = fresh_seed()
    rng = random.Random(seed)
    # block boundaries always, then random context lengths
    seq_lens = [1, block_size, block_size + 1] + [rng.randrange(2, 6000) for _ in range(21)]
    rng.shuffle(seq_lens)
    compare([1] * len(seq_lens), seq_lens, shape, dtype, block_size, seed)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_prefill_on_random_mixes(shape, dtype, block_size) -> None:
    seed = fresh_seed()
    rng = random.Random(seed)
    query_lens, seq_lens = [], []
    for _ in range(8):  # fresh prompts, chunks over a cached prefix, and decodes
        kind = rng.choice(("fresh", "chunk", "decode"))
        query = 1 if kind == "decode" else rng.randrange(1, 1500)
        prefix = 0 if kind == "fresh" else rng.randrange(1, 4000)
        query_lens.append(query)
        seq_lens.append(prefix + query)
    compare(query_lens, seq_lens, shape, dtype, block_size, seed)


@pytest.mark.parametrize("context", [16_384, 32_768, 65_536])
@pytest.mark.parametrize("shape", [(32, 8, 64), (16, 1, 128)], ids=["gqa-d64", "mqa-d128"])
def test_long_contexts(shape, context) -> None:
    seed = fresh_seed()
    # decodes at the full context and one token short, beside a short one
    compare([1, 1, 1], [context, context - 1, 3], shape, torch.bfloat16, 16, seed)
    # the last 2048-token chunk of a long prompt over its cached prefix
    compare([2048], [context], shape, torch.bfloat16, 16, seed)
