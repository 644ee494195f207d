"""Triton kernel: the MoE grouped GEMM, ``x @ W_e^T`` for every row against its own expert.

One program computes a ``BLOCK_M x BLOCK_N`` tile of the output for one row block of
:func:`~engine.models.triton_kernels.moe_align.align_rows_by_expert`'s layout: every row of the
block belongs to expert ``e = block_expert_ids[block]``, so the tile is one plain GEMM tile
against ``W_e``. Row ``r`` reads input row ``r // rows_per_token`` (the token it was routed
from) and writes output row ``r``; padding rows (id N) read and write nothing, and blocks past
``num_padded`` return at once, so the grid can be sized from the shapes alone.

Epilogue, in float32: times the expert's per-output-channel scale (int8 weights), rounded to the
model dtype (as the torch path rounds each expert's output), then — for the down projection —
times the row's routing weight, written as float32 for the float32 sum over the top-k.

:func:`moe_gemm_launch` plans the launch from the tensors and a
:class:`~engine.triton_launch.KernelTarget`; :func:`moe_gemm` runs it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.common import check_launchable
from engine.attention.triton_kernels.rounding import round_to
from engine.models.triton_kernels.moe_align import AlignedRows
from engine.models.triton_kernels.moe_config import MoEGemmConfig
from engine.triton_launch import (
    FUSED_MULTIPLY_ADD,
    KernelLaunch,
    KernelTarget,
    kernel_target,
    register_share,
)


# NOTE: not specialized on the row count (a mask bound, as in the other kernels) nor on
# rows_per_token (1 for the down projection): a division per row costs nothing next to the tile,
# and the gate/up and expert-parallel down GEMMs then share one compiled kernel.
@triton.jit(do_not_specialize=["num_rows", "rows_per_token"])
def _moe_gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    scale_ptr,
    row_weight_ptr,
    sorted_row_ids_ptr,
    block_expert_ids_ptr,
    num_padded_ptr,
    num_rows,
    rows_per_token,
    N,
    K,
    stride_x,
    stride_we,
    stride_wn,
    stride_out,
    stride_se,
    MODEL_DTYPE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    MUL_ROW_WEIGHT: tl.constexpr,
    FP32_DOT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ids_ptr + block).to(tl.int64)
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_row_ids_ptr + offs_m)  # [BM] row ids, num_rows for padding
    row_mask = rows < num_rows
    tokens = tl.where(row_mask, rows // rows_per_token, 0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tokens[:, None] * stride_x + offs_k[None, :]  # [BM, BK]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k_start
        x = tl.load(x_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if FP32_DOT:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        else:
            w = w.to(x.dtype)  # int8 weights are exact in any float dtype
        acc = tl.dot(x, w, acc, input_precision=INPUT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_SCALE:
        scale = tl.load(scale_ptr + expert * stride_se + offs_n, mask=n_mask, other=0.0)
        acc = acc * scale[None, :]
    out = round_to(acc, MODEL_DTYPE)
    if MUL_ROW_WEIGHT:
        row_weight = tl.load(row_weight_ptr + rows, mask=row_mask, other=0.0)
        out = out.to(tl.float32) * row_weight[:, None]
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_out + offs_n[None, :]
    tl.store(out_ptrs, out, mask=row_mask[:, None] & n_mask[None, :])


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def check_moe_gemm_operands(*tensors: torch.Tensor) -> None:
    """Refuse tensors the grouped GEMM cannot take: off CUDA (compiled), or with strided rows."""
    check_launchable(_moe_gemm_kernel, tensors[0])
    if any(tensor.stride(-1) != 1 for tensor in tensors):
        raise ValueError("moe_gemm needs rows contiguous in their last dimension")


def moe_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    aligned: AlignedRows,
    out: torch.Tensor,
    *,
    rows_per_token: int,
    config: MoEGemmConfig,
    row_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row ``r`` of ``out`` [N, n] = ``x[r // rows_per_token]`` [K] through its expert's
    ``weight`` [E, n, K] (int8 with ``scale`` [E, n] float32, or ``x``'s dtype); with
    ``row_weights`` [N] float32, times that weight into a float32 ``out``. Rows not in
    ``aligned`` (unowned experts) are left as they were."""
    check_moe_gemm_operands(x, weight, out)
    if out.shape[0] == 0 or aligned.block_expert_ids.numel() == 0:
        return out
    target = kernel_target(x.device)
    moe_gemm_launch(
        x, weight, scale, aligned, out, target, rows_per_token, config, row_weights
    ).run()
    return out


def moe_gemm_launch(
    x: torch.Tensor,  # [T, K]
    weight: torch.Tensor,  # [E, n, K]
    scale: torch.Tensor | None,  # [E, n] float32, for int8 weights
    aligned: AlignedRows,
    out: torch.Tensor,  # [N, n]
    target: KernelTarget,
    rows_per_token: int,
    config: MoEGemmConfig,
    row_weights: torch.Tensor | None = None,  # [N] float32
) -> KernelLaunch:
    """The launch :func:`moe_gemm` runs on ``target`` (for at least one row and one block)."""
    num_rows, n = out.shape
    k = x.shape[-1]
    block_n = min(config.block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(config.block_k, max(16, triton.next_power_of_2(k)))
    return KernelLaunch(
        _moe_gemm_kernel,
        (aligned.block_expert_ids.numel(), triton.cdiv(n, block_n)),
        (
            x,
            weight,
            out,
            scale if scale is not None else out,
            row_weights if row_weights is not None else out,
            aligned.sorted_row_ids,
            aligned.block_expert_ids,
            aligned.num_padded,
            num_rows,
            rows_per_token,
            n,
            k,
            x.stride(0),
            weight.stride(0),
            weight.stride(1),
            out.stride(0),
            scale.stride(0) if scale is not None else 0,
        ),
        {
            "MODEL_DTYPE": _TL_DTYPES[x.dtype],
            "HAS_SCALE": scale is not None,
            "MUL_ROW_WEIGHT": row_weights is not None,
            # numpy: no bf16, slow fp16 dots
            "FP32_DOT": target.interpreted and x.dtype != torch.float32,
            # float32 models multiply in full float32, not TF32 (torch's default for F.linear)
            "INPUT_PRECISION": "ieee" if x.dtype == torch.float32 else "tf32",
            "BLOCK_M": aligned.block_m,
            "BLOCK_N": block_n,
            "BLOCK_K": block_k,
        },
        # the dots accumulate in float32 on tensor cores; the epilogue multiplies, never adds
        fp_fusion=FUSED_MULTIPLY_ADD,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        # NOTE: left to itself, ptxas 13 (sm_90 on) caps the 8-warp tiles at 64 registers on
        # sm_100 and spills (the compile gate saw it); the tiles fit their whole share
        max_registers=register_share(config.num_warps),
    )
