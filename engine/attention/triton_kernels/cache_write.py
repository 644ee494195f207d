"""Triton kernel: scatter new tokens' K and V into their paged-cache slots (reshape_and_cache)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.common import (
    check_last_dim_contiguous,
    check_launchable,
    is_interpreted,
)


@triton.jit
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


def write_kv_cache(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64; negative slots are skipped
) -> None:
    """Write ``k``/``v`` at their slots of the (strided) per-layer cache view."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    check_launchable(_write_kv_kernel, k)
    check_last_dim_contiguous(kv_cache=kv_cache)
    # The interpreter pays per program, so it takes many tokens per program.
    block_t = 128 if is_interpreted(_write_kv_kernel) else 4
    _write_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        k,
        v,
        kv_cache,
        slot_mapping,
        num_tokens,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_T=block_t,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
