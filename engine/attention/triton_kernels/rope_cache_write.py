"""Triton kernel: rotate the new tokens' q and k (RoPE) and write k and v into the paged cache.

One launch replaces :func:`~engine.models.rope.apply_rope` on q and k plus the cache-write kernel:
each program takes a tile of tokens and one head; a query head writes its rotated rows to a new q,
a KV head writes its rotated k rows and its v rows at their slots (quantized for an 8-bit cache,
the same bytes :func:`~engine.attention.triton_kernels.cache_write.write_kv_cache` writes).

The rotation rounds as ``apply_rope`` does: ``x * cos`` and ``roll(x, D/2) * sin`` (the signed
sin) each rounded to the model dtype, then their sum rounded. In bfloat16 the rounding is bit
arithmetic and the result bit-identical. The kernel is compiled without FP fusion: with it, the
GPU compiler contracted a product and the sum into one multiply-add (seen on an H200: float16 off
by a few ulps where the two products cancel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.cache_write import quantize_store
from engine.attention.triton_kernels.common import (
    cache_operand,
    check_last_dim_contiguous,
    check_launchable,
    converts_fp8_bytes,
    is_quantized_cache,
    scale_view,
)
from engine.attention.triton_kernels.rounding import round_to
from engine.triton_launch import EXACT_ROUNDING, KernelLaunch, KernelTarget, kernel_target


@triton.jit
def _rotate(
    row_ptrs,  # [T] pointers to each token's row of this head
    dims,  # [D]
    mask,  # [T, D]
    cos,  # [T, D] float32
    sin,  # [T, D] float32, signed
    HEAD_DIM: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """``x * cos + roll(x, D/2) * sin`` in ``DTYPE`` with apply_rope's roundings."""
    rolled = (dims + HEAD_DIM // 2) % HEAD_DIM
    x = tl.load(row_ptrs[:, None] + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    x_rolled = tl.load(row_ptrs[:, None] + rolled[None, :], mask=mask, other=0.0).to(tl.float32)
    direct = round_to(x * cos, DTYPE).to(tl.float32)
    swapped = round_to(x_rolled * sin, DTYPE).to(tl.float32)
    return round_to(direct + swapped, DTYPE)


@triton.jit(do_not_specialize=["num_tokens"])  # a mask bound: see cache_write
def _rope_write_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    kv_ptr,
    scale_ptr,
    slot_ptr,
    num_tokens,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_cos_token,
    stride_sin_token,
    stride_q_out_token,
    stride_q_out_head,
    stride_cache_block,
    stride_cache_kind,
    stride_cache_slot,
    stride_cache_head,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,
    QMAX: tl.constexpr,
    IS_INT8: tl.constexpr,
    FP8_BYTES: tl.constexpr,
):
    # Grid: (token tiles, query heads + KV heads).
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)  # [T]
    head = tl.program_id(1)
    dims = tl.arange(0, BLOCK_D)  # [D]
    token_mask = tokens < num_tokens
    mask = token_mask[:, None] & (dims[None, :] < HEAD_DIM)  # [T, D]
    dtype = q_out_ptr.dtype.element_ty
    cos = tl.load(
        cos_ptr + tokens[:, None] * stride_cos_token + dims[None, :], mask=mask, other=0.0
    )
    sin = tl.load(
        sin_ptr + tokens[:, None] * stride_sin_token + dims[None, :], mask=mask, other=0.0
    )
    cos = cos.to(tl.float32)
    sin = sin.to(tl.float32)
    if head < NUM_Q_HEADS:
        q = _rotate(
            q_ptr + tokens * stride_q_token + head * stride_q_head,
            dims,
            mask,
            cos,
            sin,
            HEAD_DIM,
            dtype,
        )
        q_out = q_out_ptr + tokens[:, None] * stride_q_out_token + head * stride_q_out_head
        tl.store(q_out + dims[None, :], q, mask=mask)
    else:
        kv_head = head - NUM_Q_HEADS
        k = _rotate(
            k_ptr + tokens * stride_k_token + kv_head * stride_k_head,
            dims,
            mask,
            cos,
            sin,
            HEAD_DIM,
            dtype,
        )
        v_ptrs = v_ptr + tokens[:, None] * stride_v_token + kv_head * stride_v_head + dims[None, :]
        v = tl.load(v_ptrs, mask=mask, other=0.0)
        slots = tl.load(slot_ptr + tokens, mask=token_mask, other=-1).to(tl.int64)
        row_mask = slots >= 0  # padding tokens and negative slots write nothing
        write_mask = row_mask[:, None] & (dims[None, :] < HEAD_DIM)
        rows = (
            (slots // BLOCK_SIZE) * stride_cache_block
            + (slots % BLOCK_SIZE) * stride_cache_slot
            + kv_head * stride_cache_head
        )  # [T] element offset of each token's K row
        v_rows = rows + stride_cache_kind
        if QUANT:
            quantize_store(
                tl.where(write_mask, k.to(tl.float32), 0.0),
                kv_ptr + rows[:, None] + dims[None, :],
                scale_ptr + (rows + HEAD_DIM) // 2,
                write_mask,
                row_mask,
                QMAX,
                IS_INT8,
                FP8_BYTES,
            )
            quantize_store(
                tl.where(write_mask, v.to(tl.float32), 0.0),
                kv_ptr + v_rows[:, None] + dims[None, :],
                scale_ptr + (v_rows + HEAD_DIM) // 2,
                write_mask,
                row_mask,
                QMAX,
                IS_INT8,
                FP8_BYTES,
            )
        else:
            cache_dtype = kv_ptr.dtype.element_ty
            tl.store(kv_ptr + rows[:, None] + dims[None, :], k.to(cache_dtype), mask=write_mask)
            tl.store(kv_ptr + v_rows[:, None] + dims[None, :], v.to(cache_dtype), mask=write_mask)


def rope_and_write_kv_cache(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim (+ 2 if 8-bit)]
    q: torch.Tensor,  # [T, num_heads, head_dim], not yet rotated
    k: torch.Tensor,  # [T, num_kv_heads, head_dim], not yet rotated
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [T, 1, head_dim]
    sin: torch.Tensor,  # [T, 1, head_dim] (signed)
    slot_mapping: torch.Tensor,  # [T] int64; negative slots are skipped
) -> torch.Tensor:  # [T, num_heads, head_dim] rotated q, contiguous
    """Rotate ``q`` and ``k``, write the rotated ``k`` and ``v`` at their slots; return q."""
    num_tokens, num_heads, head_dim = q.shape
    q_out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    check_launchable(_rope_write_kv_kernel, q)
    check_last_dim_contiguous(q=q, k=k, v=v, cos=cos, sin=sin, kv_cache=kv_cache)
    target = kernel_target(q.device)
    rope_write_kv_launch(kv_cache, q, k, v, cos, sin, slot_mapping, q_out, target).run()
    return q_out


def rope_write_kv_launch(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim (+ 2 if 8-bit)]
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [T, 1, head_dim]
    sin: torch.Tensor,  # [T, 1, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64
    q_out: torch.Tensor,  # [T, num_heads, head_dim] contiguous
    target: KernelTarget,
) -> KernelLaunch:
    """The launch :func:`rope_and_write_kv_cache` runs on ``target``."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    # The interpreter pays per program, so it takes many tokens per program.
    block_t = 128 if target.interpreted else 4
    is_int8 = kv_cache.dtype == torch.int8
    return KernelLaunch(
        _rope_write_kv_kernel,
        (triton.cdiv(num_tokens, block_t), num_heads + num_kv_heads),
        (
            q,
            k,
            v,
            cos,
            sin,
            q_out,
            cache_operand(kv_cache, target),
            scale_view(kv_cache),
            slot_mapping,
            num_tokens,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            cos.stride(0),
            sin.stride(0),
            q_out.stride(0),
            q_out.stride(1),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            kv_cache.stride(3),
        ),
        {
            "NUM_Q_HEADS": num_heads,
            "HEAD_DIM": head_dim,
            "BLOCK_SIZE": kv_cache.shape[2],
            "BLOCK_T": block_t,
            "BLOCK_D": triton.next_power_of_2(head_dim),
            "QUANT": is_quantized_cache(kv_cache),
            "QMAX": 127.0 if is_int8 else 448.0,
            "IS_INT8": is_int8,
            "FP8_BYTES": converts_fp8_bytes(kv_cache, target),
        },
        # apply_rope's roundings: each product rounded, then the sum (no fused multiply-add)
        fp_fusion=EXACT_ROUNDING,
    )
