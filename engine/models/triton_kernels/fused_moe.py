"""The fused MoE experts: align rows by expert, grouped GEMM, SiLU * mul, grouped GEMM.

Everything stays on the device: the row layout comes from torch ops
(:func:`~engine.models.triton_kernels.moe_align.align_rows_by_expert`) and every kernel reads
the counts from it, so a step runs without a host sync and a CUDA graph can capture it. The
tile configuration depends only on shapes (:mod:`~engine.models.triton_kernels.moe_config`).
"""

from __future__ import annotations

import torch

from engine.models.triton_kernels.moe_align import align_rows_by_expert
from engine.models.triton_kernels.moe_config import MoEGemmConfig, moe_gemm_config
from engine.models.triton_kernels.moe_gemm import max_shared_memory, moe_gemm, moe_gemm_interpreted
from engine.models.triton_kernels.silu_mul import silu_and_mul


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
    num_rows = local_ids.numel()
    num_experts, two_inter, hidden_size = gate_up_proj.shape
    if config is None:
        interpreted = moe_gemm_interpreted()
        config = moe_gemm_config(
            num_rows,
            num_experts,
            hidden.dtype,
            interpreted=interpreted,
            max_shared_bytes=None if interpreted else max_shared_memory(hidden.device),
        )
    aligned = align_rows_by_expert(local_ids, num_experts, config.block_m)
    # NOTE: zeros, not empty: skipped rows must read as zero (and stay finite through SiLU).
    gate_up = hidden.new_zeros((num_rows, two_inter))  # [N, 2I]
    moe_gemm(
        hidden,
        gate_up_proj,
        gate_up_scale,
        aligned,
        gate_up,
        rows_per_token=rows_per_token,
        config=config,
    )
    activated = silu_and_mul(gate_up)  # [N, I]
    out_dtype = hidden.dtype if row_weights is None else torch.float32
    out = hidden.new_zeros((num_rows, hidden_size), dtype=out_dtype)  # [N, H]
    return moe_gemm(
        activated,
        down_proj,
        down_scale,
        aligned,
        out,
        rows_per_token=1,
        config=config,
        row_weights=row_weights,
    )
