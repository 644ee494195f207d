"""Triton kernels: scatter new tokens' K and V into their paged-cache slots (reshape_and_cache).

An 8-bit cache (``engine.kv.quantized_rows``) takes the quantizing variant: one program per tile of
tokens and one KV head computes each row's scale (``amax / qmax``, rounded to float16), stores
the row's 8-bit values and then the scale's two bytes — the same bytes the torch path writes
(an fp8 cache on a GPU without native e4m3 gets them as bytes: ``common``).

:func:`write_kv_launch` plans the launch (tile sizes, kernel variant) from the tensors and a
:class:`~engine.triton_launch.KernelTarget`; :func:`write_kv_cache` runs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.common import (
    cache_operand,
    check_last_dim_contiguous,
    check_launchable,
    converts_fp8_bytes,
    float_to_e4m3_bytes,
    is_quantized_cache,
    scale_view,
)
from engine.triton_launch import EXACT_ROUNDING, KernelLaunch, KernelTarget, kernel_target


# NOTE: token counts are not specialized on (== 1, multiple of 16): they only bound a mask, and
# every specialization is one more compile at run time (the first step of each batch size).
@triton.jit(do_not_specialize=["num_tokens"])
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    kv_ptr,
    slot_ptr,
    num_tokens,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_cache_block,
    stride_cache_kind,
    stride_cache_slot,
    stride_cache_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per BLOCK_T new tokens; columns are (kv head, dim) pairs of one token.
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [T]
    cols = tl.arange(0, BLOCK_H * BLOCK_D)
    heads = cols // BLOCK_D  # [C]
    dims = cols % BLOCK_D  # [C]
    slots = tl.load(slot_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    blocks = slots // BLOCK_SIZE
    offsets = slots % BLOCK_SIZE
    # Padding tokens and negative slots write nothing.
    mask = (slots[:, None] >= 0) & (heads[None, :] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    k = tl.load(
        k_ptr + tokens[:, None] * stride_k_token + heads[None, :] * stride_k_head + dims[None, :],
        mask=mask,
    )  # [T, C]
    v = tl.load(
        v_ptr + tokens[:, None] * stride_v_token + heads[None, :] * stride_v_head + dims[None, :],
        mask=mask,
    )
    dst = (
        kv_ptr
        + (blocks * stride_cache_block + offsets * stride_cache_slot)[:, None]
        + heads[None, :] * stride_cache_head
        + dims[None, :]
    )
    tl.store(dst, k.to(kv_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_cache_kind, v.to(kv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def quantize_store(
    x,  # [T, D] float32, zero outside the row
    dst,  # [T, D] pointers to the row's values
    scale_dst,  # [T] float16 pointers to the row's scale
    mask,
    row_mask,
    QMAX: tl.constexpr,
    IS_INT8: tl.constexpr,
    FP8_BYTES: tl.constexpr,
):
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) / QMAX, 2.0**-24).to(tl.float16)  # [T]
    y = x / scale.to(tl.float32)[:, None]
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if IS_INT8:  # round half away from zero
        y = tl.where(y >= 0.0, tl.floor(y + 0.5), tl.ceil(y - 0.5))
    else:  # to the nearest e4m3 value (ties away from zero), so the cast below is exact
        magnitude = tl.abs(y)
        step = tl.exp2(tl.floor(tl.log2(tl.maximum(magnitude, 2.0**-6))) - 3.0)
        y = tl.where(y >= 0.0, 1.0, -1.0) * tl.floor(magnitude / step + 0.5) * step
    if FP8_BYTES:
        tl.store(dst, float_to_e4m3_bytes(y), mask=mask)
    else:
        tl.store(dst, y.to(dst.dtype.element_ty), mask=mask)
    tl.store(scale_dst, scale, mask=row_mask)


@triton.jit(do_not_specialize=["num_tokens"])
def _write_kv_quant_kernel(
    k_ptr,
    v_ptr,
    kv_ptr,
    scale_ptr,
    slot_ptr,
    num_tokens,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_cache_block,
    stride_cache_kind,
    stride_cache_slot,
    stride_cache_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QMAX: tl.constexpr,
    IS_INT8: tl.constexpr,
    FP8_BYTES: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [T]
    head = tl.program_id(1)
    dims = tl.arange(0, BLOCK_D)
    slots = tl.load(slot_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    row_mask = slots >= 0  # padding tokens and negative slots write nothing
    mask = row_mask[:, None] & (dims[None, :] < HEAD_DIM)
    rows = (
        (slots // BLOCK_SIZE) * stride_cache_block
        + (slots % BLOCK_SIZE) * stride_cache_slot
        + head * stride_cache_head
    )  # [T] element offset of each token's K row
    k = tl.load(
        k_ptr + tokens[:, None] * stride_k_token + head * stride_k_head + dims[None, :],
        mask=mask,
        other=0.0,
    ).to(tl.float32)
    quantize_store(
        k,
        kv_ptr + rows[:, None] + dims[None, :],
        scale_ptr + (rows + HEAD_DIM) // 2,
        mask,
        row_mask,
        QMAX,
        IS_INT8,
        FP8_BYTES,
    )
    v = tl.load(
        v_ptr + tokens[:, None] * stride_v_token + head * stride_v_head + dims[None, :],
        mask=mask,
        other=0.0,
    ).to(tl.float32)
    v_rows = rows + stride_cache_kind
    quantize_store(
        v,
        kv_ptr + v_rows[:, None] + dims[None, :],
        scale_ptr + (v_rows + HEAD_DIM) // 2,
        mask,
        row_mask,
        QMAX,
        IS_INT8,
        FP8_BYTES,
    )


def write_kv_cache(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64; negative slots are skipped
) -> None:
    """Write ``k``/``v`` at their slots of the (strided) per-layer cache view."""
    if k.shape[0] == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    check_launchable(_write_kv_kernel, k)
    check_last_dim_contiguous(kv_cache=kv_cache)
    write_kv_launch(kv_cache, k, v, slot_mapping, kernel_target(k.device)).run()


def write_kv_launch(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim (+ 2 if 8-bit)]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim], contiguous in head_dim
    v: torch.Tensor,  # [T, num_kv_heads, head_dim], contiguous in head_dim
    slot_mapping: torch.Tensor,  # [T] int64
    target: KernelTarget,
) -> KernelLaunch:
    """The launch :func:`write_kv_cache` runs on ``target``."""
    num_tokens, num_kv_heads, head_dim = k.shape
    # The interpreter pays per program, so it takes many tokens per program.
    block_t = 128 if target.interpreted else 4
    cache = cache_operand(kv_cache, target)
    strides = (
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
    )
    if is_quantized_cache(kv_cache):
        is_int8 = kv_cache.dtype == torch.int8
        return KernelLaunch(
            _write_kv_quant_kernel,
            (triton.cdiv(num_tokens, block_t), num_kv_heads),
            (k, v, cache, scale_view(kv_cache), slot_mapping, num_tokens, *strides),
            {
                "HEAD_DIM": head_dim,
                "BLOCK_SIZE": kv_cache.shape[2],
                "BLOCK_T": block_t,
                "BLOCK_D": triton.next_power_of_2(head_dim),
                "QMAX": 127.0 if is_int8 else 448.0,
                "IS_INT8": is_int8,
                "FP8_BYTES": converts_fp8_bytes(kv_cache, target),
            },
            fp_fusion=EXACT_ROUNDING,  # the torch path's bytes
        )
    return KernelLaunch(
        _write_kv_kernel,
        (triton.cdiv(num_tokens, block_t),),
        (k, v, cache, slot_mapping, num_tokens, *strides),
        {
            "NUM_KV_HEADS": num_kv_heads,
            "HEAD_DIM": head_dim,
            "BLOCK_SIZE": kv_cache.shape[2],
            "BLOCK_T": block_t,
            "BLOCK_H": triton.next_power_of_2(num_kv_heads),
            "BLOCK_D": triton.next_power_of_2(head_dim),
        },
        fp_fusion=EXACT_ROUNDING,  # a copy: nothing to fuse
    )
