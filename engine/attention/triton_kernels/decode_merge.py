"""Triton kernel: merge the split-KV decode kernel's partial results into the attention output.

Split ``s`` of a (sequence, query head) leaves its attention output over its own token range,
already normalised, and that range's log-sum-exp (base 2, ``-inf`` for an empty range). The full
output is the softmax over the splits' log-sum-exps applied to their outputs — the same online
softmax step the attention kernels use, with one tile whose "keys" are the splits. The split
count is a run-time value under a tile of :data:`~splits.MAX_SPLITS`: one compiled kernel serves
every count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.common import online_softmax_finish, online_softmax_step
from engine.attention.triton_kernels.splits import MAX_SPLITS
from engine.triton_launch import FUSED_MULTIPLY_ADD, KernelLaunch


@triton.jit(do_not_specialize=["num_splits"])  # a mask bound and an offset factor
def _merge_splits_kernel(
    out_ptr,
    partial_out_ptr,  # [B, H, S, HEAD_DIM] float32
    partial_lse_ptr,  # [B, H, S] float32
    stride_out_token,
    stride_out_head,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    first_row = (seq * tl.num_programs(1) + head) * num_splits
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    lse = tl.load(
        partial_lse_ptr + first_row + splits, mask=splits < num_splits, other=float("-inf")
    )  # [S]
    part_mask = (splits[:, None] < num_splits) & (dims[None, :] < HEAD_DIM)
    parts = tl.load(
        partial_out_ptr + (first_row + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=part_mask,
        other=0.0,
    )  # [S, D]
    no_max = tl.full([1], float("-inf"), tl.float32)
    no_sum = tl.zeros([1], tl.float32)
    # weights [1, S]: each split's share of the softmax denominator; total [1] their sum
    weights, _, _, total = online_softmax_step(no_max, no_sum, lse[None, :])
    acc = tl.sum(tl.trans(weights) * parts, axis=0, keep_dims=True)  # [1, D]
    out = online_softmax_finish(acc, total)  # [1, D]
    tl.store(
        out_ptr + seq * stride_out_token + head * stride_out_head + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=dims[None, :] < HEAD_DIM,
    )


def merge_splits_launch(
    out: torch.Tensor,  # [B, num_heads, head_dim]
    partial_out: torch.Tensor,  # [B, num_heads, num_splits, head_dim] float32, contiguous
    partial_lse: torch.Tensor,  # [B, num_heads, num_splits] float32, contiguous
) -> KernelLaunch:
    """The launch that writes into ``out`` the attention output the splits' partial results add
    up to."""
    num_seqs, num_heads, num_splits, head_dim = partial_out.shape
    if num_splits > MAX_SPLITS:
        raise ValueError(f"at most {MAX_SPLITS} splits merge, got {num_splits}")
    return KernelLaunch(
        _merge_splits_kernel,
        (num_seqs, num_heads),
        (out, partial_out, partial_lse, out.stride(0), out.stride(1), num_splits),
        {
            "HEAD_DIM": head_dim,
            "BLOCK_S": triton.next_power_of_2(MAX_SPLITS),
            "BLOCK_D": triton.next_power_of_2(head_dim),
        },
        fp_fusion=FUSED_MULTIPLY_ADD,  # checked within a tolerance
    )
