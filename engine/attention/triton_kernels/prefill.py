"""Triton kernel: varlen causal prefill attention over paged KV (cached prefix + new tokens).

The batch is flattened: sequence ``i`` brings ``query_len`` new tokens that sit at absolute
positions ``seq_len - query_len ..`` of its context. The new tokens' K/V are already in the cache
(the backend writes them first), so one path reads the whole context — cached prefix, earlier
chunks and the new tokens alike — through the block table.

One program per (sequence, tile of new tokens, kv head). Its rows are (token, query head) pairs:
row ``r`` is token ``r // GROUP`` of the tile and query head ``kv_head * GROUP + r % GROUP``, so
each K/V tile is loaded once for the whole query group. Keys are walked in ``BLOCK_N`` tiles up to
the tile's last causal position, with an fp32 online softmax.

:func:`paged_prefill_launch` plans the launch from the tensors and a
:class:`~engine.triton_launch.KernelTarget`; :func:`paged_prefill_attention` runs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.common import (
    LOG2_E,
    MIN_DOT_SIZE,
    cache_operand,
    check_last_dim_contiguous,
    check_launchable,
    converts_fp8_bytes,
    is_quantized_cache,
    load_kv_tile,
    load_row_scales,
    needs_fp32_dot,
    online_softmax_finish,
    online_softmax_step,
    scale_view,
)
from engine.triton_launch import FUSED_MULTIPLY_ADD, KernelLaunch, KernelTarget, kernel_target

# (keys per K/V tile, warps) by whether the cache is 8-bit (``common.is_quantized_cache``: why
# fewer keys). 64 keys with 4 warps spill at head_dim 128 on sm_80 (and ptxas 13 caps sm_100
# at 168 registers for 4 warps); these fit on sm_80, sm_90 and sm_100.
_TILING = {False: (32, 8), True: (16, 8)}


# NOTE: not specialized on the window or the table width: see the decode kernel.
@triton.jit(do_not_specialize=["window", "stride_table_seq"])
def _paged_prefill_kernel(
    out_ptr,
    q_ptr,
    kv_ptr,
    scale_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    qk_scale,
    window,
    stride_q_token,
    stride_q_head,
    stride_out_token,
    stride_out_head,
    stride_cache_block,
    stride_cache_kind,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr,
    QUANT: tl.constexpr,
    FP8_BYTES: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    query_start = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - query_start
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_R)
    dims = tl.arange(0, BLOCK_D)
    row_tokens = tile * TILE_TOKENS + rows // GROUP  # [R] index among the new tokens
    row_heads = kv_head * GROUP + rows % GROUP  # [R]
    row_positions = prefix_len + row_tokens  # [R] absolute position in the context
    row_valid = (rows < TILE_TOKENS * GROUP) & (row_tokens < query_len)
    q_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr
        + (query_start + row_tokens)[:, None] * stride_q_token
        + row_heads[:, None] * stride_q_head
        + dims[None, :],
        mask=q_mask,
        other=0.0,
    )  # [R, D] in the model's dtype; K and V tiles come in q's dtype
    if FP32_DOT:
        q = q.to(tl.float32)
    k_row = kv_head * stride_cache_head  # element offset of this head's K rows in a slot
    k_base = kv_ptr + k_row
    v_base = k_base + stride_cache_kind
    table = block_tables_ptr + seq * stride_table_seq
    # Causal: nothing past this tile's last token; a tile past the sequence's end reads nothing.
    kv_end = tl.minimum(seq_len, prefix_len + (tile + 1) * TILE_TOKENS)
    kv_end = tl.where(tile * TILE_TOKENS < query_len, kv_end, 0)

    row_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    # a sliding window (window > 0): nothing before the tile's first row's window
    kv_start = tl.where(window > 0, tl.maximum(prefix_len + tile * TILE_TOKENS - window + 1, 0), 0)
    for start in range((kv_start // BLOCK_N) * BLOCK_N, kv_end, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)  # [N]
        in_range = tokens < kv_end
        block_ids = tl.load(table + tokens // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
        token_offsets = block_ids * stride_cache_block + (tokens % BLOCK_SIZE) * stride_cache_slot
        kv_mask = in_range[:, None] & (dims[None, :] < HEAD_DIM)
        k = load_kv_tile(k_base, token_offsets, dims, kv_mask, FP8_BYTES, q.dtype)  # [N, D]
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")  # [R, N]
        if QUANT:  # the K rows' scales, on the scores (common: why)
            k_rows = k_row + token_offsets
            scores *= load_row_scales(scale_ptr, k_rows, in_range, HEAD_DIM, FP8_BYTES)[None, :]
        visible = in_range[None, :] & (tokens[None, :] <= row_positions[:, None])
        visible &= (window == 0) | (tokens[None, :] > row_positions[:, None] - window)
        scores = tl.where(visible, scores * qk_scale, float("-inf"))  # log2 units
        probs, rescale, row_max, row_sum = online_softmax_step(row_max, row_sum, scores)
        v = load_kv_tile(v_base, token_offsets, dims, kv_mask, FP8_BYTES, q.dtype)
        if QUANT:  # the V rows' scales, on the probabilities
            v_rows = k_row + stride_cache_kind + token_offsets
            probs *= load_row_scales(scale_ptr, v_rows, in_range, HEAD_DIM, FP8_BYTES)[None, :]
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
    out = online_softmax_finish(acc, row_sum)
    tl.store(
        out_ptr
        + (query_start + row_tokens)[:, None] * stride_out_token
        + row_heads[:, None] * stride_out_head
        + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def paged_prefill_attention(
    out: torch.Tensor,  # [T, num_heads, head_dim]
    q: torch.Tensor,  # [T, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    max_query_len: int,
    scale: float,
    block_rows: int = 64,
    block_n: int | None = None,
    window: int | None = None,
) -> None:
    """Causal attention of every new token over its sequence's paged context (its last
    ``window`` positions when given), into ``out``; ``block_n`` keys per tile (default: the
    table's)."""
    if seq_lens.shape[0] == 0 or max_query_len == 0:
        return
    if q.stride(-1) != 1:
        q = q.contiguous()
    check_launchable(_paged_prefill_kernel, q)
    check_last_dim_contiguous(out=out, kv_cache=kv_cache)
    paged_prefill_launch(
        out,
        q,
        kv_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        max_query_len,
        scale,
        kernel_target(q.device),
        block_rows=block_rows,
        block_n=block_n,
        window=window,
    ).run()


def paged_prefill_launch(
    out: torch.Tensor,  # [T, num_heads, head_dim]
    q: torch.Tensor,  # [T, num_heads, head_dim], contiguous in head_dim
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim (+ 2 if 8-bit)]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    max_query_len: int,
    scale: float,
    target: KernelTarget,
    *,
    block_rows: int = 64,
    block_n: int | None = None,
    window: int | None = None,
) -> KernelLaunch:
    """The launch :func:`paged_prefill_attention` runs on ``target``."""
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    block_r = triton.next_power_of_2(max(MIN_DOT_SIZE, block_rows, group))
    tile_tokens = block_r // group
    keys_per_tile, num_warps = _TILING[is_quantized_cache(kv_cache)]
    keys_per_tile = block_n or keys_per_tile
    return KernelLaunch(
        _paged_prefill_kernel,
        (seq_lens.shape[0], triton.cdiv(max_query_len, tile_tokens), num_kv_heads),
        (
            out,
            q,
            cache_operand(kv_cache, target),
            scale_view(kv_cache),
            block_tables,
            seq_lens,
            query_start_loc,
            scale * LOG2_E,
            window or 0,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            kv_cache.stride(3),
            block_tables.stride(0),
        ),
        {
            "GROUP": group,
            "HEAD_DIM": head_dim,
            "BLOCK_SIZE": kv_cache.shape[2],
            "TILE_TOKENS": tile_tokens,
            "BLOCK_R": block_r,
            "BLOCK_D": max(MIN_DOT_SIZE, triton.next_power_of_2(head_dim)),
            "BLOCK_N": triton.next_power_of_2(max(MIN_DOT_SIZE, keys_per_tile)),
            "FP32_DOT": needs_fp32_dot(target, q.dtype),
            "QUANT": is_quantized_cache(kv_cache),
            "FP8_BYTES": converts_fp8_bytes(kv_cache, target),
        },
        fp_fusion=FUSED_MULTIPLY_ADD,  # checked within a tolerance: fewer, exacter roundings
        num_warps=num_warps,
    )
