"""Triton kernels: the LoRA delta of a mixed-adapter step, SGMV style (shrink, then expand).

The step's adapter rows come grouped by slot (:class:`~engine.models.lora.batch.LoRABatch`):
one program per (group, tile of rows, tile of columns) reads its group's slot and rows
once, so a batch of many adapters costs one launch per kernel, not one per adapter.
``shrink``: ``buf[rows, :] = x[rows] @ A_slot^T`` ([T, G * R] float32, every segment's rank at
once). ``expand`` (once per segment ``j``): ``y[rows, cols_j] += scale_slot * buf[rows, jR:jR+R]
@ B_slot[cols_j]^T``, accumulated in float32 and rounded to ``y``'s dtype once. Rows of the base
model are in no group: untouched. Checked against the torch path
(:mod:`engine.models.lora.delta`) under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.common import check_launchable
from engine.models.lora.batch import LoRABatch
from engine.triton_launch import FUSED_MULTIPLY_ADD, KernelLaunch, kernel_target

_BLOCK_M = 16  # rows per program (tl.dot needs >= 16)
_BLOCK_N = 32  # output columns per program
_BLOCK_K = 32  # reduction step


@triton.jit
def _shrink_kernel(
    x_ptr,  # [T, K]
    a_ptr,  # [S, N, K]
    buf_ptr,  # [T, N] float32
    sorted_rows_ptr,  # [R] int64
    group_slots_ptr,  # [G] int32
    group_starts_ptr,  # [G] int32
    group_lens_ptr,  # [G] int32
    stride_x,
    stride_a_slot,
    stride_a_row,
    stride_buf,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    group = tl.program_id(0)
    length = tl.load(group_lens_ptr + group)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    if tl.program_id(1) * BLOCK_M >= length:
        return
    slot = tl.load(group_slots_ptr + group).to(tl.int64)
    start = tl.load(group_starts_ptr + group)
    row_mask = m < length
    rows = tl.load(sorted_rows_ptr + start + m, mask=row_mask, other=0)  # [BM] int64
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    n_mask = n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        k_mask = k < K
        xs = tl.load(
            x_ptr + rows[:, None] * stride_x + k[None, :],
            mask=row_mask[:, None] & k_mask[None, :],
            other=0.0,
        )  # [BM, BK]
        at = tl.load(
            a_ptr + slot * stride_a_slot + n[None, :] * stride_a_row + k[:, None],
            mask=n_mask[None, :] & k_mask[:, None],
            other=0.0,
        )  # [BK, BN]: A^T
        if FP32_DOT:
            xs = xs.to(tl.float32)
            at = at.to(tl.float32)
        acc = tl.dot(xs, at, acc, input_precision=INPUT_PRECISION)
    tl.store(
        buf_ptr + rows[:, None] * stride_buf + n[None, :],
        acc,
        mask=row_mask[:, None] & n_mask[None, :],
    )


@triton.jit
def _expand_kernel(
    buf_ptr,  # [T, G * R] float32, this segment's R columns from the pointer on
    b_ptr,  # [S, out, R], this segment's first output row from the pointer on
    y_ptr,  # [T, out], this segment's first column from the pointer on
    scales_ptr,  # [S] float32
    sorted_rows_ptr,
    group_slots_ptr,
    group_starts_ptr,
    group_lens_ptr,
    stride_buf,
    stride_b_slot,
    stride_b_row,
    stride_y,
    N: tl.constexpr,  # the segment's output columns
    R: tl.constexpr,  # the slots' rank
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    group = tl.program_id(0)
    length = tl.load(group_lens_ptr + group)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(1) * BLOCK_M >= length:
        return
    slot = tl.load(group_slots_ptr + group).to(tl.int64)
    start = tl.load(group_starts_ptr + group)
    row_mask = m < length
    rows = tl.load(sorted_rows_ptr + start + m, mask=row_mask, other=0)  # [BM]
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    n_mask = n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)  # [BR]
        r_mask = r < R
        shrunk = tl.load(
            buf_ptr + rows[:, None] * stride_buf + r[None, :],
            mask=row_mask[:, None] & r_mask[None, :],
            other=0.0,
        )  # [BM, BR] float32
        bt = tl.load(
            b_ptr + slot * stride_b_slot + n[None, :] * stride_b_row + r[:, None],
            mask=n_mask[None, :] & r_mask[:, None],
            other=0.0,
        ).to(tl.float32)  # [BR, BN]: B^T
        acc = tl.dot(shrunk, bt, acc, input_precision=INPUT_PRECISION)
    scale = tl.load(scales_ptr + slot)
    mask = row_mask[:, None] & n_mask[None, :]
    y_ptrs = y_ptr + rows[:, None] * stride_y + n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + acc * scale).to(y_ptr.dtype.element_ty), mask=mask)


def add_lora_delta_triton(
    x: torch.Tensor,  # [T, in]
    y: torch.Tensor,  # [T, out]
    a: torch.Tensor,  # [S, G * R, in]
    b: torch.Tensor,  # [S, out, R]
    scales: torch.Tensor,  # [S] float32
    segments: Sequence[tuple[int, int]],
    batch: LoRABatch,
) -> None:
    """:func:`~engine.models.lora.delta.add_lora_delta_torch` through the shrink and expand
    kernels: ``y`` gains every adapter row's delta in place."""
    check_launchable(_shrink_kernel, x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_rows, rank = y.shape[0], b.shape[-1]
    width = a.shape[1]
    buf = torch.empty((num_rows, width), dtype=torch.float32, device=x.device)  # [T, G * R]
    # float32 models multiply in full float32 (torch's F.linear), not TF32
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    target = kernel_target(x.device)
    row_tiles = triton.cdiv(batch.max_group_len, _BLOCK_M)
    group_args = (batch.sorted_rows, batch.group_slots, batch.group_starts, batch.group_lens)
    KernelLaunch(
        _shrink_kernel,
        (batch.num_groups, row_tiles, triton.cdiv(width, _BLOCK_N)),
        (x, a, buf, *group_args, x.stride(0), a.stride(0), a.stride(1), buf.stride(0)),
        {
            "N": width,
            "K": x.shape[1],
            "BLOCK_M": _BLOCK_M,
            "BLOCK_N": _BLOCK_N,
            "BLOCK_K": _BLOCK_K,
            "FP32_DOT": target.interpreted and x.dtype != torch.float32,  # numpy: no bf16
            "INPUT_PRECISION": precision,
        },
        FUSED_MULTIPLY_ADD,
    ).run()
    block_r = max(16, triton.next_power_of_2(min(rank, 64)))
    for j, (first, end) in enumerate(segments):
        KernelLaunch(
            _expand_kernel,
            (batch.num_groups, row_tiles, triton.cdiv(end - first, _BLOCK_N)),
            (
                buf[:, j * rank :],
                b[:, first:],
                y[:, first:],
                scales,
                *group_args,
                buf.stride(0),
                b.stride(0),
                b.stride(1),
                y.stride(0),
            ),
            {
                "N": end - first,
                "R": rank,
                "BLOCK_M": _BLOCK_M,
                "BLOCK_N": _BLOCK_N,
                "BLOCK_R": block_r,
                "INPUT_PRECISION": precision,
            },
            FUSED_MULTIPLY_ADD,
        ).run()
