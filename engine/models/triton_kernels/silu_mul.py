"""Triton kernel: the gated MLP's activation, ``silu(gate) * up`` over the fused gate/up output.

``silu_and_mul(gate_up)`` reads ``gate_up`` [T, 2I] (gate columns first, as ``chunk(2)`` splits
it) and writes [T, I]: one pass where torch runs silu, a product and their temporaries. The
rounding is torch's: ``silu = x / (1 + exp(-x))`` in float32 rounded to the model dtype, then the
product rounded. Compiled, ``exp`` is libdevice's ``expf`` (what torch's CUDA silu calls, where
``tl.exp`` would be the approximate ``ex2``); interpreted it is numpy's, which may differ from
torch's CPU ``exp`` in the last float32 bit. The kernel is compiled without FP fusion (torch's
roundings).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from engine.attention.triton_kernels.common import check_launchable
from engine.attention.triton_kernels.rounding import round_to
from engine.triton_launch import EXACT_ROUNDING, KernelLaunch, KernelTarget, kernel_target


@triton.jit(do_not_specialize=["num_rows"])  # a mask bound: see rms_norm
def _silu_mul_kernel(
    gate_up_ptr,
    out_ptr,
    num_rows,
    stride_gate_up,
    stride_out,
    INTERMEDIATE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_I: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):
    # One program per (BLOCK_ROWS rows, BLOCK_I output columns) tile.
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)  # [R]
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)  # [C]
    mask = (rows[:, None] < num_rows) & (cols[None, :] < INTERMEDIATE)
    dtype = out_ptr.dtype.element_ty
    gate_ptrs = gate_up_ptr + rows[:, None] * stride_gate_up + cols[None, :]
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)  # [R, C]
    up = tl.load(gate_ptrs + INTERMEDIATE, mask=mask, other=0.0).to(tl.float32)
    decay = libdevice.exp(-gate) if LIBDEVICE_EXP else tl.exp(-gate)
    silu = round_to(tl.math.div_rn(gate, 1.0 + decay), dtype)  # rounded like torch's silu
    out = round_to(silu.to(tl.float32) * up, dtype)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out, mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up`` [..., 2I] -> ``silu(gate) * up`` [..., I] in its dtype."""
    intermediate = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * intermediate)  # [N, 2I]
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    check_launchable(_silu_mul_kernel, rows)
    out = torch.empty((rows.shape[0], intermediate), dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0] > 0:
        silu_mul_launch(rows, out, kernel_target(rows.device)).run()
    return out.view(*gate_up.shape[:-1], intermediate)


def silu_mul_launch(
    rows: torch.Tensor,  # [N, 2I], contiguous in its last dim
    out: torch.Tensor,  # [N, I] contiguous
    target: KernelTarget,
) -> KernelLaunch:
    """The launch that writes ``silu(gate) * up`` of ``rows`` into ``out`` on ``target``."""
    num_rows, intermediate = out.shape
    block_rows = 16 if target.interpreted else 1
    block_i = min(triton.next_power_of_2(intermediate), 4096 if target.interpreted else 1024)
    return KernelLaunch(
        _silu_mul_kernel,
        (triton.cdiv(num_rows, block_rows), triton.cdiv(intermediate, block_i)),
        (rows, out, num_rows, rows.stride(0), out.stride(0)),
        {
            "INTERMEDIATE": intermediate,
            "BLOCK_ROWS": block_rows,
            "BLOCK_I": block_i,
            "LIBDEVICE_EXP": not target.interpreted,
        },
        fp_fusion=EXACT_ROUNDING,  # torch's roundings
    )
