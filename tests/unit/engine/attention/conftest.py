"""Shared builders for the paged-attention tests: random paged batches and a dense reference.

A case is a batch of sequences whose whole K/V history is known densely; the cached part of each
history is written into a block-major KV tensor (through shuffled, non-contiguous block ids) by a
plain per-token loop, independent of the code under test, and the new tokens are handed to the
backend as ``k``/``v``. Every other slot of the cache holds random garbage, so a backend that
reads past a sequence's context gets a wrong answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch

from engine.attention.metadata import AttentionMetadata

NUM_LAYERS = 3
LAYER = 1


@dataclass
class PagedCase:
    """One batch: backend inputs plus the dense history the reference attends over."""

    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor  # [T, Hkv, D]
    kv: torch.Tensor  # [num_blocks, num_layers, 2, block_size, Hkv, D]
    meta: AttentionMetadata
    keys: list[torch.Tensor]  # per seq [seq_len, Hkv, D]
    values: list[torch.Tensor]  # per seq [seq_len, Hkv, D]
    scale: float

    @property
    def layer_cache(self) -> torch.Tensor:
        """The strided per-layer view a backend receives."""
        return self.kv[:, LAYER]


def build_case(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    *,
    block_size: int = 16,
    num_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    dtype: torch.dtype = torch.float32,
    spare_blocks: int = 3,
    seed: int = 0,
    device: str = "cpu",
) -> PagedCase:
    """A random batch with shuffled block tables and garbage in every unused slot."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    block_ids = list(range(num_blocks))
    rng.shuffle(block_ids)
    tables: list[list[int]] = []
    for count in blocks_per_seq:
        tables.append(block_ids[:count])
        block_ids = block_ids[count:]

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    kv = randn(num_blocks, NUM_LAYERS, 2, block_size, num_kv_heads, head_dim)
    keys = [randn(s, num_kv_heads, head_dim) for s in seq_lens]
    values = [randn(s, num_kv_heads, head_dim) for s in seq_lens]
    for table, q_len, s_len, seq_k, seq_v in zip(
        tables, query_lens, seq_lens, keys, values, strict=True
    ):
        for pos in range(s_len - q_len):
            block, offset = table[pos // block_size], pos % block_size
            kv[block, LAYER, 0, offset] = seq_k[pos]
            kv[block, LAYER, 1, offset] = seq_v[pos]
    new_k = torch.cat([sk[s - q :] for sk, q, s in zip(keys, query_lens, seq_lens, strict=True)])
    new_v = torch.cat([sv[s - q :] for sv, q, s in zip(values, query_lens, seq_lens, strict=True)])
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size, device=device)
    return PagedCase(
        q=randn(sum(query_lens), num_heads, head_dim).to(device),
        k=new_k.to(device),
        v=new_v.to(device),
        kv=kv.to(device),
        meta=meta,
        keys=[t.to(device) for t in keys],
        values=[t.to(device) for t in values],
        scale=head_dim**-0.5,
    )


def dense_reference(case: PagedCase) -> torch.Tensor:  # [T, Hq, D] float64
    """Naive float64 attention of each new query over its dense history with an explicit mask."""
    outs = []
    start = 0
    for q_len, s_len, seq_k, seq_v in zip(
        case.meta.query_lens_list, case.meta.seq_lens_list, case.keys, case.values, strict=True
    ):
        q = case.q[start : start + q_len].double().cpu()  # [Tq, Hq, D]
        group = q.shape[1] // seq_k.shape[1]
        k = seq_k.double().cpu().repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = seq_v.double().cpu().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale  # [Hq, Tq, S]
        query_pos = torch.arange(s_len - q_len, s_len)[:, None]
        key_pos = torch.arange(s_len)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
        start += q_len
    return torch.cat(outs)


@pytest.fixture
def paged_case() -> Callable[..., PagedCase]:
    """Factory fixture: ``paged_case(query_lens, seq_lens, **shape)``."""
    return build_case


@pytest.fixture
def reference() -> Callable[[PagedCase], torch.Tensor]:
    """The dense float64 reference."""
    return dense_reference
