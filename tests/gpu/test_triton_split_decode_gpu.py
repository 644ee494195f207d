"""The split-KV decode kernel on CUDA: forced split counts against the torch backend at long
contexts, replays of one captured graph while the lengths change, and its speed at batch 1.

Inputs are fresh every run; a failure names its seed.
"""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttentionBackend
from engine.attention.triton_kernels import write_kv_cache
from engine.attention.triton_kernels.decode import paged_decode_attention
from engine.kv.quantized_rows import pack_rows
from tests.gpu.helpers import fresh_seed
from tests.gpu.paged_batches import DEVICE, TOLERANCE, make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

LLAMA_1B, LLAMA_8B, MQA = (32, 8, 64), (32, 8, 128), (16, 1, 128)


def compare_splits(
    seq_lens: list[int],
    shape: tuple[int, int, int],
    num_splits: int | None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    block_size: int = 16,
    window: int | None = None,
    kv_dtype: torch.dtype | None = None,
) -> None:
    """The decode kernel with ``num_splits`` == the torch backend on one fresh random batch."""
    seed = fresh_seed()
    q, k, v, kv, meta = make_batch([1] * len(seq_lens), seq_lens, shape, dtype, block_size, seed)
    if kv_dtype is not None:
        kv = pack_rows(kv, kv_dtype)
    torch_kv = kv.clone()
    scale = shape[2] ** -0.5
    expected = TorchAttentionBackend().forward(q, k, v, torch_kv[:, 1], meta, scale, window)
    write_kv_cache(kv[:, 1], k, v, meta.slot_mapping)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(
        out,
        q,
        kv[:, 1],
        meta.block_tables,
        meta.seq_lens,
        scale,
        window=window,
        num_splits=num_splits,
    )
    torch.cuda.synchronize()
    tolerance = 2e-2 if kv_dtype is not None else TOLERANCE[dtype]
    torch.testing.assert_close(
        out,
        expected,
        atol=tolerance,
        rtol=tolerance,
        msg=lambda m: f"{m} (seed={seed} shape={shape} splits={num_splits} lens={seq_lens})",
    )


@pytest.mark.parametrize("num_splits", [None, 1, 2, 7, 16, 64])
@pytest.mark.parametrize("shape", [LLAMA_1B, LLAMA_8B, MQA], ids=["1b", "8b", "mqa"])
def test_split_counts_match_the_torch_backend(shape, num_splits) -> None:
    compare_splits([1, 15, 16, 17, 640, 4097, 10_000], shape, num_splits)


@pytest.mark.parametrize("context", [16_384, 32_768, 65_536])
@pytest.mark.parametrize("shape", [LLAMA_1B, MQA], ids=["1b", "mqa"])
def test_long_contexts(shape, context) -> None:
    compare_splits([context, context - 1, 3], shape, None)
    compare_splits([context], shape, 64, dtype=torch.float16, block_size=32)


@pytest.mark.parametrize("window", [100, 4096])
def test_sliding_window(window) -> None:
    compare_splits([50, 3000, 9000], LLAMA_8B, None, window=window)
    compare_splits([50, 3000, 9000], LLAMA_8B, 16, window=window, block_size=32)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_8bit_cache(kv_dtype) -> None:
    compare_splits([7, 640, 20_000], LLAMA_1B, None, kv_dtype=kv_dtype)


def test_graph_replays_follow_the_lengths() -> None:
    # One graph captured at batch 2 (its split count fixed), replayed while both sequences'
    # lengths move across tiles, splits and the whole table: every replay == the torch backend.
    seed = fresh_seed()
    torch.manual_seed(seed)
    num_heads, num_kv_heads, head_dim = LLAMA_1B
    block_size, max_len = 16, 20_000
    width = -(-max_len // block_size)
    kv = torch.randn(
        2 * width, 2, block_size, num_kv_heads, head_dim, device=DEVICE, dtype=torch.bfloat16
    )  # [num_blocks, 2, block_size, Hkv, D]
    tables = torch.randperm(2 * width, device=DEVICE).view(2, width).to(torch.int32)
    seq_lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, num_heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    scale = head_dim**-0.5

    def step() -> None:
        paged_decode_attention(out, q, kv, tables, seq_lens, scale)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for lens in ([1, 1], [5, 3000], [700, 17], [max_len, 64], [2, max_len - 1]):
        seq_lens.copy_(torch.tensor(lens))
        q.copy_(torch.randn_like(q))
        graph.replay()
        host_tables = tables.tolist()
        meta = AttentionMetadata.build([1, 1], lens, host_tables, block_size, device=DEVICE)
        # the new tokens' K/V are already in the cache: the reference rewrites them unchanged
        slots = meta.slot_mapping.long()
        new_k = kv[slots // block_size, 0, slots % block_size]  # [2, Hkv, D]
        new_v = kv[slots // block_size, 1, slots % block_size]
        expected = TorchAttentionBackend().forward(q, new_k, new_v, kv.clone(), meta, scale)
        torch.testing.assert_close(
            out,
            expected,
            atol=2e-2,
            rtol=2e-2,
            msg=lambda m, lens=lens: f"{m} (seed={seed} lens={lens})",
        )
