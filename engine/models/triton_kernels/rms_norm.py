"""Triton kernel: RMSNorm over the last dim, optionally fused with the residual add before it.

``add_rms_norm(x, residual, weight, eps)`` returns ``(rms_norm(x + residual), x + residual)``:
one read of each input and one write of each output, where the unfused path reads the sum back.
The arithmetic replays :class:`~engine.models.layers.RMSNorm`'s torch path: the sum is rounded to
the model dtype, the norm runs in float32, the normalised value is rounded to the model dtype and
then multiplied by the weight (a product of two 16-bit floats is exact in float32, so rounding it
once gives the half-precision product). The one difference is the order of the float32 sum of
squares, which no two reductions share: a normalised value that lands within an ulp of a rounding
boundary may round the other way. The kernel is compiled without FP fusion (torch rounds each
product before the sum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels.common import check_launchable
from engine.attention.triton_kernels.rounding import round_to
from engine.triton_launch import EXACT_ROUNDING, KernelLaunch, KernelTarget, kernel_target


# NOTE: the row count only bounds a mask; specialized on (== 1, multiple of 16) it would compile
# once more per kind of batch size.
@triton.jit(do_not_specialize=["num_rows"])
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    out_ptr,
    residual_out_ptr,
    weight_ptr,
    num_rows,
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    eps,
    HIDDEN_SIZE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # One program per BLOCK_ROWS rows, each row whole in one tile.
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)  # [R]
    cols = tl.arange(0, BLOCK_H)  # [C]
    col_mask = cols < HIDDEN_SIZE
    mask = (rows[:, None] < num_rows) & col_mask[None, :]
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    h = x.to(tl.float32)  # [R, C]
    if HAS_RESIDUAL:
        residual = tl.load(
            residual_ptr + rows[:, None] * stride_residual + cols[None, :], mask=mask, other=0.0
        )
        summed = round_to(h + residual.to(tl.float32), dtype)  # rounded like torch's add
        tl.store(
            residual_out_ptr + rows[:, None] * stride_residual_out + cols[None, :],
            summed,
            mask=mask,
        )
        h = summed.to(tl.float32)
    variance = tl.math.div_rn(tl.sum(h * h, axis=1), HIDDEN_SIZE * 1.0)  # [R]
    normed = round_to(h * tl.math.rsqrt(variance + eps)[:, None], dtype)  # [R, C]
    weight = tl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)  # [C]
    out = round_to(weight[None, :] * normed.to(tl.float32), dtype)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` [..., H] -> RMSNorm(x) [..., H] in ``x``'s dtype."""
    return _launch(x, None, None, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x``, ``residual`` [..., H] -> (RMSNorm(x + residual), x + residual), both new tensors."""
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # [..., H]
    return _launch(x, residual, summed, weight, eps), summed


def _launch(
    x: torch.Tensor,  # [..., H]
    residual: torch.Tensor | None,  # [..., H]
    summed: torch.Tensor | None,  # [..., H] contiguous: x + residual goes here
    weight: torch.Tensor,  # [H]
    eps: float,
) -> torch.Tensor:  # [..., H]
    hidden_size = x.shape[-1]
    rows = x.reshape(-1, hidden_size)  # [N, H]; a copy only when x's rows are not uniform
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    check_launchable(_rms_norm_kernel, rows)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)  # [N, H]
    residual_rows = None
    if residual is not None:
        residual_rows = residual.reshape(-1, hidden_size).contiguous()
    if rows.shape[0] > 0:
        summed_rows = None if summed is None else summed.view(rows.shape)
        target = kernel_target(rows.device)
        rms_norm_launch(rows, residual_rows, out, summed_rows, weight, eps, target).run()
    return out.view(x.shape)


def rms_norm_launch(
    rows: torch.Tensor,  # [N, H], contiguous in H
    residual_rows: torch.Tensor | None,  # [N, H] contiguous
    out: torch.Tensor,  # [N, H] contiguous
    summed_rows: torch.Tensor | None,  # [N, H] contiguous: rows + residual_rows go here
    weight: torch.Tensor,  # [H]
    eps: float,
    target: KernelTarget,
) -> KernelLaunch:
    """The launch that writes RMSNorm(rows (+ residual_rows)) into ``out`` on ``target``."""
    num_rows, hidden_size = rows.shape
    # The interpreter pays per program, so it takes many rows per program.
    block_rows = 16 if target.interpreted else 1
    block_h = triton.next_power_of_2(hidden_size)
    residual = out if residual_rows is None else residual_rows  # never read without a residual
    summed = out if summed_rows is None else summed_rows
    return KernelLaunch(
        _rms_norm_kernel,
        (triton.cdiv(num_rows, block_rows),),
        (
            rows,
            residual,
            out,
            summed,
            weight,
            num_rows,
            rows.stride(0),
            residual.stride(0),
            out.stride(0),
            summed.stride(0),
            eps,
        ),
        {
            "HIDDEN_SIZE": hidden_size,
            "HAS_RESIDUAL": residual_rows is not None,
            "BLOCK_ROWS": block_rows,
            "BLOCK_H": block_h,
        },
        fp_fusion=EXACT_ROUNDING,  # torch's roundings, bit for bit
        num_warps=min(max(block_h // 512, 1), 16),  # a row of 4096 takes 8 warps
    )
