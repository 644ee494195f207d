"""The Triton kernels and backend against the dense reference and the torch backend.

Not collected directly (no ``test_`` prefix): ``test_triton_interpreter.py`` runs this file in a
fresh interpreter process with ``TRITON_INTERPRET=1``, because Triton picks compiled vs
interpreted kernels once, when triton is first imported — an in-process run would depend on what
the rest of the session imported first. To run it by hand on CPU:
``TRITON_INTERPRET=1 .venv/bin/pytest tests/unit/engine/attention/triton_cases.py``.
Shapes are tiny: the interpreter pays per program and per loop trip.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention import TorchAttentionBackend, get_backend
from engine.attention.torch_backend import write_kv_cache as torch_write_kv_cache
from engine.attention.triton_backend import TritonAttentionBackend
from engine.attention.triton_kernels import (
    interpreter_active,
    paged_decode_attention,
    paged_prefill_attention,
    rope_and_write_kv_cache,
    write_kv_cache,
)
from engine.attention.triton_kernels.decode import paged_decode_launches
from engine.cuda_graphs import DecodeBuffers, pad_decode
from engine.cuda_graphs.block_table_rows import BlockTableRows
from engine.cuda_graphs.buckets import PADDING_ROW
from engine.kv.quantized_rows import pack_rows
from engine.triton_launch import INTERPRETER, kernel_target
from engine.triton_launch import target as launch_target

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}
HEADS = [(4, 4), (8, 2), (16, 2), (8, 1)]  # GQA ratios 1, 4, 8 and MQA
# Every head layout in fp32, the low-precision dtypes on one GQA layout: the interpreter is slow.
LAYOUTS = [(h, kv, torch.float32) for h, kv in HEADS] + [
    (8, 2, torch.bfloat16),
    (8, 2, torch.float16),
]
LAYOUT_IDS = [f"{h}q-{kv}kv-{str(dtype).removeprefix('torch.')}" for h, kv, dtype in LAYOUTS]


def check(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def decode(case, block_n: int = 64) -> torch.Tensor:
    write_kv_cache(case.layer_cache, case.k, case.v, case.meta.slot_mapping)
    out = torch.full_like(case.q, float("nan"))
    meta = case.meta
    paged_decode_attention(
        out, case.q, case.layer_cache, meta.block_tables, meta.seq_lens, case.scale, block_n
    )
    return out


def prefill(case, block_rows: int = 64, block_n: int = 64) -> torch.Tensor:
    write_kv_cache(case.layer_cache, case.k, case.v, case.meta.slot_mapping)
    out = torch.full_like(case.q, float("nan"))
    meta = case.meta
    paged_prefill_attention(
        out,
        case.q,
        case.layer_cache,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        meta.max_query_len,
        case.scale,
        block_rows,
        block_n,
    )
    return out


def test_kernels_run_where_they_can() -> None:
    assert interpreter_active() or torch.cuda.is_available(), (
        "on CPU, set TRITON_INTERPRET=1 before triton is imported"
    )
    assert isinstance(get_backend("triton"), TritonAttentionBackend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_matches_torch(paged_case, dtype) -> None:
    case = paged_case([3, 1, 6], [3, 20, 14], block_size=4, num_kv_heads=3, dtype=dtype)
    expected = case.kv.clone()
    torch_write_kv_cache(expected[:, 1], case.k, case.v, case.meta.slot_mapping, 4)
    write_kv_cache(case.layer_cache, case.k, case.v, case.meta.slot_mapping)
    assert torch.equal(case.kv, expected)


def test_cache_write_skips_negative_slots(paged_case) -> None:
    case = paged_case([2], [2])
    before = case.kv.clone()
    write_kv_cache(case.layer_cache, case.k, case.v, torch.tensor([-1, -1]))
    assert torch.equal(case.kv, before)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "dtype"), LAYOUTS, ids=LAYOUT_IDS)
def test_decode_matches_reference(paged_case, reference, dtype, num_heads, num_kv_heads) -> None:
    case = paged_case(
        [1] * 4, [1, 17, 40, 16], num_heads=num_heads, num_kv_heads=num_kv_heads, dtype=dtype
    )
    check(decode(case), reference(case), dtype)


@pytest.mark.parametrize(("block_size", "head_dim"), [(1, 32), (8, 64), (32, 32)])
def test_decode_tiles_span_blocks(paged_case, reference, block_size, head_dim) -> None:
    # 16-token tiles over 1-, 8- and 32-token blocks: a tile covers many blocks or part of one.
    case = paged_case([1, 1, 1], [5, 64, 37], block_size=block_size, head_dim=head_dim)
    check(decode(case, block_n=16), reference(case), torch.float32)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "dtype"), LAYOUTS, ids=LAYOUT_IDS)
def test_prefill_over_prefix_matches_reference(
    paged_case, reference, dtype, num_heads, num_kv_heads
) -> None:
    # a prefix hit, a middle chunk of a long prompt, a fresh prompt and a decode in one batch
    case = paged_case(
        [9, 20, 12, 1],
        [25, 50, 12, 30],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        block_size=8,
        dtype=dtype,
    )
    check(prefill(case), reference(case), dtype)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (6, 2)])
def test_prefill_small_tiles(paged_case, reference, num_heads, num_kv_heads) -> None:
    # 16-row tiles: several query tiles per sequence and several key tiles per query tile;
    # a group of 3 heads does not divide the 16 rows.
    case = paged_case(
        [21, 16, 5], [40, 16, 37], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=64
    )
    check(prefill(case, block_rows=16, block_n=16), reference(case), torch.float32)


def test_backend_matches_torch_backend_and_cache(paged_case) -> None:
    # decode, prefill over prefixes, and whole fresh prompts (the SDPA path)
    for query_lens, seq_lens in (
        ([1, 1, 1], [33, 8, 16]),
        ([7, 1, 12], [7, 20, 30]),
        ([9, 25], [9, 25]),
    ):
        case = paged_case(query_lens, seq_lens, block_size=8)
        torch_kv = case.kv.clone()
        expected = TorchAttentionBackend().forward(
            case.q, case.k, case.v, torch_kv[:, 1], case.meta, case.scale
        )
        out = TritonAttentionBackend().forward(
            case.q, case.k, case.v, case.layer_cache, case.meta, case.scale
        )
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
        assert torch.equal(case.kv, torch_kv)


def test_backend_over_padded_static_buffers_matches_unpadded(paged_case, reference) -> None:
    # What a CUDA graph replays: a decode step padded to its bucket in the static buffers, with
    # a stale block-table tail and placeholder host lists. Real rows must match the reference;
    # padding rows must write no KV (block 0 is a real block here) and stay finite.
    case = paged_case([1, 1, 1], [5, 33, 17], block_size=8)
    device = case.q.device
    static = DecodeBuffers(max_batch=8, max_table_width=8, block_size=8, device=device)
    table_rows = BlockTableRows(max_rows=8, width=8, device=device)
    # rows of other requests, and stale entries past each context, hold garbage block ids
    table_rows.table.copy_(torch.randint(0, case.kv.shape[0], table_rows.table.shape))
    table_rows.table[PADDING_ROW] = 0
    needed = [-(-s // 8) for s in (5, 33, 17)]
    tables = [
        (f"r{i}", row[:n])
        for i, (row, n) in enumerate(zip(case.meta.block_tables.tolist(), needed, strict=True))
    ]
    rows = table_rows.rows(tables)
    padded = pad_decode([0, 0, 0], [5, 33, 17], needed, rows, bucket=8, block_size=8,
                        max_table_width=8)  # fmt: skip
    static.load(padded)
    static.derive(8, table_rows.table)
    expected_kv = case.kv.clone()
    torch_write_kv_cache(expected_kv[:, 1], case.k, case.v, case.meta.slot_mapping, 8)

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.randn(5, *x.shape[1:], dtype=x.dtype)])  # garbage rows

    out = TritonAttentionBackend().forward(
        pad(case.q), pad(case.k), pad(case.v), case.layer_cache, static.metadata(8), case.scale
    )
    check(out[:3], reference(case), torch.float32)
    assert torch.isfinite(out[3:]).all()
    assert torch.equal(case.kv, expected_kv)


QUANT_DTYPES = [torch.int8, torch.float8_e4m3fn]


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES, ids=["int8", "fp8_e4m3"])
def test_8bit_cache_matches_the_torch_backend_bytes_and_outputs(paged_case, kv_dtype) -> None:
    # decode-only, prefill over a prefix, fresh prompts (attended as the 8-bit cache holds
    # them), and a GQA layout with a non-power-of-2 head_dim
    shapes = (
        ([1, 1, 1], [33, 8, 16], {}),
        ([7, 1, 12], [7, 20, 30], {}),
        ([9, 25], [9, 25], {}),
        ([5, 1], [21, 9], {"num_heads": 6, "num_kv_heads": 2, "head_dim": 24}),
    )
    for query_lens, seq_lens, shape in shapes:
        case = paged_case(query_lens, seq_lens, block_size=8, **shape)
        packed = pack_rows(case.kv, kv_dtype)  # every slot, garbage included, as 8-bit rows
        torch_kv, triton_kv = packed.clone(), packed.clone()
        expected = TorchAttentionBackend().forward(
            case.q, case.k, case.v, torch_kv[:, 1], case.meta, case.scale
        )
        out = TritonAttentionBackend().forward(
            case.q, case.k, case.v, triton_kv[:, 1], case.meta, case.scale
        )
        # the cache-write kernel stores the torch path's bytes, values and scales alike
        assert torch.equal(triton_kv.view(torch.uint8), torch_kv.view(torch.uint8))
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [5, 16, 23])
def test_sliding_window_matches_the_torch_backend(paged_case, window) -> None:
    for query_lens, seq_lens in (([1, 1, 1], [33, 8, 40]), ([7, 1, 12], [7, 20, 30])):
        case = paged_case(query_lens, seq_lens, block_size=8)
        torch_kv = case.kv.clone()
        expected = TorchAttentionBackend().forward(
            case.q, case.k, case.v, torch_kv[:, 1], case.meta, case.scale, window
        )
        out = TritonAttentionBackend().forward(
            case.q, case.k, case.v, case.layer_cache, case.meta, case.scale, window
        )
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
        full = TorchAttentionBackend().forward(
            case.q, case.k, case.v, case.kv.clone()[:, 1], case.meta, case.scale
        )
        assert not torch.allclose(out, full, atol=1e-3)  # the window really cut the context


# Split-KV decode: (num_heads, num_kv_heads, head_dim, block_size, num_splits). 16-token tiles
# over contexts of up to 77 tokens: several tiles and blocks per context, several tiles per split,
# and splits past a short sequence's end (empty: they must leave a neutral partial).
SPLIT_LAYOUTS = [
    (4, 4, 64, 16, 3),  # MHA
    (8, 2, 128, 32, 4),  # GQA 4, the larger head and block
    (16, 2, 64, 16, 5),  # GQA 8
    (8, 1, 128, 16, 2),  # MQA
    (8, 2, 64, 32, 1),  # the single-pass path, no merge
]
SPLIT_IDS = [f"{h}q-{kv}kv-d{d}-b{b}-s{s}" for h, kv, d, b, s in SPLIT_LAYOUTS]
SPLIT_SEQ_LENS = [1, 5, 40, 77]


def split_decode(
    case, num_splits: int, window: int | None = None, cache: torch.Tensor | None = None
) -> torch.Tensor:
    cache = case.layer_cache if cache is None else cache
    write_kv_cache(cache, case.k, case.v, case.meta.slot_mapping)
    out = torch.full_like(case.q, float("nan"))
    meta = case.meta
    paged_decode_attention(
        out,
        case.q,
        cache,
        meta.block_tables,
        meta.seq_lens,
        case.scale,
        block_n=16,
        window=window,
        num_splits=num_splits,
    )
    return out


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "num_splits"),
    SPLIT_LAYOUTS,
    ids=SPLIT_IDS,
)
def test_split_decode_matches_reference(
    paged_case, reference, num_heads, num_kv_heads, head_dim, block_size, num_splits
) -> None:
    case = paged_case(
        [1] * 4,
        SPLIT_SEQ_LENS,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
    )
    check(split_decode(case, num_splits), reference(case), torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_split_decode_low_precision(paged_case, reference, dtype) -> None:
    case = paged_case([1] * 4, SPLIT_SEQ_LENS, head_dim=64, dtype=dtype)
    check(split_decode(case, 3), reference(case), dtype)


def test_more_splits_than_tiles(paged_case, reference) -> None:
    # 16 splits over at most 2 tiles: nearly every program has an empty range
    case = paged_case([1] * 3, [1, 2, 17], num_heads=4, num_kv_heads=1)
    check(split_decode(case, 16), reference(case), torch.float32)


@pytest.mark.parametrize("window", [5, 23])
def test_split_decode_sliding_window_matches_the_torch_backend(paged_case, window) -> None:
    # windows shorter than, across and beyond a split's range; one context inside the window
    case = paged_case([1] * 3, [3, 40, 77], block_size=8)
    expected = TorchAttentionBackend().forward(
        case.q, case.k, case.v, case.kv.clone()[:, 1], case.meta, case.scale, window
    )
    out = split_decode(case, 4, window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES, ids=["int8", "fp8_e4m3"])
def test_split_decode_8bit_cache_matches_the_torch_backend(paged_case, kv_dtype) -> None:
    case = paged_case([1] * 3, [9, 40, 77], num_heads=8, num_kv_heads=2, head_dim=64)
    packed = pack_rows(case.kv, kv_dtype)
    torch_kv, triton_kv = packed.clone(), packed.clone()
    expected = TorchAttentionBackend().forward(
        case.q, case.k, case.v, torch_kv[:, 1], case.meta, case.scale
    )
    out = split_decode(case, 3, cache=triton_kv[:, 1])
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


# --- 8-bit caches under low-precision models; fp8 on a GPU without native e4m3 -----------------

LOW_PRECISION = [torch.bfloat16, torch.float16]
EIGHT_BIT_SHAPES = (  # decode-only; prefill over a prefix; a non-power-of-2 head_dim
    ([1, 1, 1], [33, 8, 16], {}),
    ([7, 1, 12], [7, 20, 30], {}),
    ([5, 1], [21, 9], {"num_heads": 6, "num_kv_heads": 2, "head_dim": 24}),
)


def forward_on_8bit_cache(case, kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(Triton out, torch out) of one forward over the case's history packed as 8-bit rows;
    asserts both backends wrote the same bytes."""
    packed = pack_rows(case.kv, kv_dtype)  # every slot, garbage included, as 8-bit rows
    torch_kv, triton_kv = packed.clone(), packed.clone()
    expected = TorchAttentionBackend().forward(
        case.q, case.k, case.v, torch_kv[:, 1], case.meta, case.scale
    )
    out = TritonAttentionBackend().forward(
        case.q, case.k, case.v, triton_kv[:, 1], case.meta, case.scale
    )
    assert torch.equal(triton_kv.view(torch.uint8), torch_kv.view(torch.uint8))
    return out, expected


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES, ids=["int8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["bf16", "fp16"])
def test_8bit_cache_under_a_low_precision_model(paged_case, kv_dtype, dtype) -> None:
    # q stays in the model dtype, K/V tiles convert to it as they are, the row scales apply to
    # scores and probabilities: one rounding fewer than the torch path's dequantize-then-attend
    for query_lens, seq_lens, shape in EIGHT_BIT_SHAPES:
        case = paged_case(query_lens, seq_lens, block_size=8, dtype=dtype, **shape)
        out, expected = forward_on_8bit_cache(case, kv_dtype)
        assert out.dtype == dtype
        torch.testing.assert_close(out, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.fixture
def simulated_sm80(monkeypatch) -> None:
    """The interpreter standing in for an A100: compute capability 8.0, no native e4m3."""
    monkeypatch.setattr(
        launch_target, "INTERPRETER", dataclasses.replace(INTERPRETER, capability=(8, 0))
    )
    assert not kernel_target(torch.device("cpu")).native_fp8_e4m3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fp8_cache_on_a_simulated_sm80_goes_through_bytes(paged_case, simulated_sm80, dtype):
    for query_lens, seq_lens, shape in EIGHT_BIT_SHAPES:
        case = paged_case(query_lens, seq_lens, block_size=8, dtype=dtype, **shape)
        out, expected = forward_on_8bit_cache(case, torch.float8_e4m3fn)
        tolerance = 1e-4 if dtype == torch.float32 else TOLERANCE[dtype]
        torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    # the launches read and write the cache as bytes
    meta, cache = case.meta, pack_rows(case.kv, torch.float8_e4m3fn)[:, 1]
    target = kernel_target(case.q.device)
    decode = paged_decode_launches(
        case.q, case.q, cache, meta.block_tables, meta.seq_lens, case.scale, target
    )
    assert decode[0].constexprs["FP8_BYTES"] and decode[0].args[4].dtype == torch.uint8


def test_fused_rope_write_on_a_simulated_sm80_stores_the_native_bytes(
    paged_case, monkeypatch
) -> None:
    case = paged_case([5, 1, 12], [21, 9, 12], block_size=8, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    cos = torch.rand(case.q.shape[0], 1, case.q.shape[2], generator=gen).to(torch.bfloat16)
    sin = torch.rand(case.q.shape[0], 1, case.q.shape[2], generator=gen).to(torch.bfloat16)
    packed = pack_rows(case.kv, torch.float8_e4m3fn)
    native_kv, bytes_kv = packed.clone(), packed.clone()
    args = (case.q, case.k, case.v, cos, sin, case.meta.slot_mapping)
    native_q = rope_and_write_kv_cache(native_kv[:, 1], *args)
    monkeypatch.setattr(
        launch_target, "INTERPRETER", dataclasses.replace(INTERPRETER, capability=(8, 0))
    )
    bytes_q = rope_and_write_kv_cache(bytes_kv[:, 1], *args)
    assert torch.equal(bytes_q, native_q)
    assert torch.equal(bytes_kv.view(torch.uint8), native_kv.view(torch.uint8))
    assert not torch.equal(bytes_kv.view(torch.uint8), packed.view(torch.uint8))  # it wrote
