"""The fused MoE experts: align rows by expert, grouped GEMM, SiLU * mul, grouped GEMM.

Everything stays on the device: the row layout comes from torch ops
(:func:`~engine.models.triton_kernels.moe_align.align_rows_by_expert`) and every kernel reads
the counts from it, so a step runs without a host sync and a CUDA graph can capture it. The
tile configuration depends only on shapes (:mod:`~engine.models.triton_kernels.moe_config`).
"""

from __future__ import annotations

import torch

from engine.models.triton_kernels.moe_align import align_rows_by_expert
from engine.models.triton_kernels.moe_config import (
    TUNED_CAPABILITY,
    MoEGemmConfig,
    moe_gemm_config,
)
from engine.models.triton_kernels.moe_gemm import check_moe_gemm_operands, moe_gemm_launch
from engine.models.triton_kernels.silu_mul import silu_mul_launch
from engine.triton_launch import KernelLaunch, KernelTarget, kernel_target


def fused_moe_experts(
    hidden: torch.Tensor,
    local_ids: torch.Tensor,
    rows_per_token: int,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_scale: torch.Tensor | None,
    down_scale: torch.Tensor | None,
    row_weights: torch.Tensor | None,
    config: MoEGemmConfig | None = None,
) -> torch.Tensor:
    """Row ``r`` = ``hidden[r // rows_per_token]`` [T, H] through local expert ``local_ids[r]``
    ([N] int64; -1: not owned, skipped) of ``gate_up_proj`` [E, 2I, H] and ``down_proj``
    [E, H, I] (int8 with float32 per-row scales, or ``hidden``'s dtype).

    Returns [N, H]: the experts' outputs in ``hidden``'s dtype, or with ``row_weights`` [N]
    float32 those outputs times the weights as float32 (ready for the sum over the top-k).
    Skipped rows are zero. ``config``: the tile configuration, by default the table's for these
    shapes (``benchmarks/moe_tiles.py`` passes its candidates).
    """
    check_moe_gemm_operands(hidden, gate_up_proj, down_proj)
    out, launches = fused_moe_launches(
        hidden,
        local_ids,
        rows_per_token,
        gate_up_proj,
        down_proj,
        gate_up_scale,
        down_scale,
        row_weights,
        kernel_target(hidden.device),
        config,
    )
    for launch in launches:
        launch.run()
    return out


def fused_moe_launches(
    hidden: torch.Tensor,
    local_ids: torch.Tensor,
    rows_per_token: int,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_scale: torch.Tensor | None,
    down_scale: torch.Tensor | None,
    row_weights: torch.Tensor | None,
    target: KernelTarget,
    config: MoEGemmConfig | None = None,
) -> tuple[torch.Tensor, list[KernelLaunch]]:
    """The output :func:`fused_moe_experts` returns and the launches on ``target`` that fill it:
    gate/up GEMM, SiLU * mul, down GEMM (none without rows). The row layout is computed here
    (torch ops on the device), the intermediates allocated here."""
    num_rows = local_ids.numel()
    num_experts, two_inter, hidden_size = gate_up_proj.shape
    if config is None:
        config = moe_gemm_config(
            num_rows,
            num_experts,
            hidden.dtype,
            interpreted=target.interpreted,
            max_shared_bytes=None if target.interpreted else target.max_shared_bytes,
            capability=target.capability or TUNED_CAPABILITY,
            int8_weights=gate_up_proj.dtype == torch.int8,
        )
    aligned = align_rows_by_expert(local_ids, num_experts, config.block_m)
    out_dtype = hidden.dtype if row_weights is None else torch.float32
    out = hidden.new_zeros((num_rows, hidden_size), dtype=out_dtype)  # [N, H]
    if num_rows == 0 or aligned.block_expert_ids.numel() == 0:
        return out, []
    # NOTE: zeros, not empty: skipped rows must read as zero (and stay finite through SiLU).
    gate_up = hidden.new_zeros((num_rows, two_inter))  # [N, 2I]
    activated = hidden.new_empty((num_rows, two_inter // 2))  # [N, I]
    return out, [
        moe_gemm_launch(
            hidden, gate_up_proj, gate_up_scale, aligned, gate_up, target, rows_per_token, config
        ),
        silu_mul_launch(gate_up, activated, target),
        moe_gemm_launch(
            activated, down_proj, down_scale, aligned, out, target, 1, config, row_weights
        ),
    ]
