"""Triton kernel: paged decode attention (one new query token per sequence), split-KV.

One program per (sequence, kv head, split) handles that kv head's whole query group at once (the
group's rows padded to 16 for ``tl.dot``), so each K/V tile is read once for all
``num_heads // num_kv_heads`` query heads (GQA/MQA for free). Each sequence's context — its last
``window`` positions under a sliding window — is cut into ``num_splits`` ranges of whole
``BLOCK_N``-token tiles, sized from the sequence's length at run time; the program walks its range
with an fp32 online softmax. Each token's block id comes from the block table (any
``block_size`` works, tiles may span blocks).

With one split the program writes the output itself. With more, it writes its range's normalised
output and log-sum-exp to scratch (an empty range — a short sequence — leaves the neutral
``(0, -inf)``) and :mod:`decode_merge` folds the splits together. How many splits:
:mod:`splits`; the count is the grid's third dimension, read inside the kernel, so every split
count shares one compiled kernel.

:func:`paged_decode_launches` plans the launches from the tensors and a
:class:`~engine.triton_launch.KernelTarget`; :func:`paged_decode_attention` runs them.
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
from engine.attention.triton_kernels.decode_merge import merge_splits_launch
from engine.attention.triton_kernels.splits import choose_num_splits
from engine.triton_launch import FUSED_MULTIPLY_ADD, KernelLaunch, KernelTarget, kernel_target

# (keys per K/V tile, warps) by whether the cache is 8-bit (``common.is_quantized_cache``: why
# fewer keys); both fit the registers without spilling on sm_80, sm_90 and sm_100.
_TILING = {False: (64, 4), True: (16, 4)}


# NOTE: the window and the block-table width change from step to step (an eager step's table is
# as wide as its longest context) and are used once per program: specialized on (== 1, multiple
# of 16), each kind of value would compile the kernel once more.
@triton.jit(do_not_specialize=["window", "stride_table_seq"])
def _paged_decode_kernel(
    out_ptr,  # [B, H, D]: the output, when the grid has one split
    partial_out_ptr,  # [B, H, S, D] float32: each split's output, when it has several
    partial_lse_ptr,  # [B, H, S] float32: each split's log-sum-exp (base 2)
    q_ptr,
    kv_ptr,
    scale_ptr,
    block_tables_ptr,
    seq_lens_ptr,
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
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr,
    QUANT: tl.constexpr,
    FP8_BYTES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + groups  # [G]
    q_mask = (groups[:, None] < GROUP) & (dims[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_q_token + heads[:, None] * stride_q_head + dims[None, :],
        mask=q_mask,
        other=0.0,
    )  # [G, D] in the model's dtype; K and V tiles come in q's dtype
    if FP32_DOT:
        q = q.to(tl.float32)
    k_row = kv_head * stride_cache_head  # element offset of this head's K rows in a slot
    k_base = kv_ptr + k_row
    v_base = k_base + stride_cache_kind
    table = block_tables_ptr + seq * stride_table_seq

    # a sliding window (window > 0) skips the tiles wholly before the new token's last `window`
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    first_tile_start = (first // BLOCK_N) * BLOCK_N
    # this split's share of the tiles, whole tiles each; past the end for a short sequence
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len - first_tile_start, BLOCK_N), num_splits)
    split_start = first_tile_start + split * tiles_per_split * BLOCK_N
    split_end = tl.minimum(split_start + tiles_per_split * BLOCK_N, seq_len)

    row_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(split_start, split_end, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)  # [N]
        in_seq = (tokens < seq_len) & (tokens >= first)
        block_ids = tl.load(table + tokens // BLOCK_SIZE, mask=in_seq, other=0).to(tl.int64)
        token_offsets = block_ids * stride_cache_block + (tokens % BLOCK_SIZE) * stride_cache_slot
        kv_mask = in_seq[:, None] & (dims[None, :] < HEAD_DIM)
        k = load_kv_tile(k_base, token_offsets, dims, kv_mask, FP8_BYTES, q.dtype)  # [N, D]
        # V is requested before the dot: both tiles' reads are in flight at once
        v = load_kv_tile(v_base, token_offsets, dims, kv_mask, FP8_BYTES, q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")  # [G, N]
        if QUANT:  # the K rows' scales, on the scores (common: why)
            k_rows = k_row + token_offsets
            scores *= load_row_scales(scale_ptr, k_rows, in_seq, HEAD_DIM, FP8_BYTES)[None, :]
        scores = tl.where(in_seq[None, :], scores * qk_scale, float("-inf"))  # log2 units
        probs, rescale, row_max, row_sum = online_softmax_step(row_max, row_sum, scores)
        if QUANT:  # the V rows' scales, on the probabilities
            v_rows = k_row + stride_cache_kind + token_offsets
            probs *= load_row_scales(scale_ptr, v_rows, in_seq, HEAD_DIM, FP8_BYTES)[None, :]
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
    out = online_softmax_finish(acc, row_sum)  # [G, D]
    # NOTE: a run-time branch, not a constexpr: one compiled kernel serves every split count.
    if num_splits == 1:
        tl.store(
            out_ptr + seq * stride_out_token + heads[:, None] * stride_out_head + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=q_mask,
        )
    else:
        rows = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split  # [G]
        tl.store(partial_out_ptr + rows[:, None] * HEAD_DIM + dims[None, :], out, mask=q_mask)
        seen = row_sum > 0.0  # [G] false for an empty range
        lse = tl.where(seen, row_max + tl.log2(tl.where(seen, row_sum, 1.0)), float("-inf"))
        tl.store(partial_lse_ptr + rows, lse, mask=groups < GROUP)


def paged_decode_attention(
    out: torch.Tensor,  # [B, num_heads, head_dim]
    q: torch.Tensor,  # [B, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    block_n: int | None = None,
    window: int | None = None,
    num_splits: int | None = None,
) -> None:
    """Attend each sequence's single new query over its whole paged context (its last
    ``window`` positions when given), into ``out``.

    ``num_splits`` ranges per context (default :func:`choose_num_splits` for this batch on this
    GPU; 1 is the single-pass kernel); ``block_n`` keys per tile (default: the table's).
    """
    if q.shape[0] == 0:
        return
    if q.stride(-1) != 1:
        q = q.contiguous()
    check_launchable(_paged_decode_kernel, q)
    check_last_dim_contiguous(out=out, kv_cache=kv_cache)
    launches = paged_decode_launches(
        out,
        q,
        kv_cache,
        block_tables,
        seq_lens,
        scale,
        kernel_target(q.device),
        block_n=block_n,
        window=window,
        num_splits=num_splits,
    )
    for launch in launches:
        launch.run()


def paged_decode_launches(
    out: torch.Tensor,  # [B, num_heads, head_dim]
    q: torch.Tensor,  # [B, num_heads, head_dim], contiguous in head_dim
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim (+ 2 if 8-bit)]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    target: KernelTarget,
    *,
    block_n: int | None = None,
    window: int | None = None,
    num_splits: int | None = None,
) -> list[KernelLaunch]:
    """The launches :func:`paged_decode_attention` runs on ``target``: the decode kernel, then
    the merge of its splits when there are several.

    NOTE: the split scratch is allocated here, per call: under CUDA-graph capture it comes from
    the graph's private memory pool, so every replay reuses the captured addresses; eagerly it
    is a caching-allocator hit.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[3]
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, target.num_sms)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if num_splits == 1:  # the kernel writes the output itself: a float32 stand-in for scratch
        partial_out = partial_lse = q.new_empty(1, dtype=torch.float32)
    else:
        partial_out = q.new_empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32)
        partial_lse = q.new_empty(num_seqs, num_heads, num_splits, dtype=torch.float32)
    group = num_heads // num_kv_heads
    keys_per_tile, num_warps = _TILING[is_quantized_cache(kv_cache)]
    keys_per_tile = block_n or keys_per_tile
    decode = KernelLaunch(
        _paged_decode_kernel,
        (num_seqs, num_kv_heads, num_splits),
        (
            out,
            partial_out,
            partial_lse,
            q,
            cache_operand(kv_cache, target),
            scale_view(kv_cache),
            block_tables,
            seq_lens,
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
            "BLOCK_G": max(MIN_DOT_SIZE, triton.next_power_of_2(group)),
            "BLOCK_D": max(MIN_DOT_SIZE, triton.next_power_of_2(head_dim)),
            "BLOCK_N": triton.next_power_of_2(max(MIN_DOT_SIZE, keys_per_tile)),
            "FP32_DOT": needs_fp32_dot(target, q.dtype),
            "QUANT": is_quantized_cache(kv_cache),
            "FP8_BYTES": converts_fp8_bytes(kv_cache, target),
        },
        fp_fusion=FUSED_MULTIPLY_ADD,  # checked within a tolerance: fewer, exacter roundings
        num_warps=num_warps,
    )
    if num_splits == 1:
        return [decode]
    return [decode, merge_splits_launch(out, partial_out, partial_lse)]
