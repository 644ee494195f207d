"""Triton kernels of the model's layers: residual add + RMSNorm, SiLU * mul, the MoE experts."""

from engine.models.triton_kernels.custom_ops import (
    add_rms_norm_op,
    fused_moe_experts_op,
    rms_norm_op,
    silu_and_mul_op,
)
from engine.models.triton_kernels.fused_moe import fused_moe_experts
from engine.models.triton_kernels.moe_align import AlignedRows, align_rows_by_expert
from engine.models.triton_kernels.rms_norm import add_rms_norm, rms_norm
from engine.models.triton_kernels.silu_mul import silu_and_mul

__all__ = [
    "AlignedRows",
    "add_rms_norm",
    "add_rms_norm_op",
    "align_rows_by_expert",
    "fused_moe_experts",
    "fused_moe_experts_op",
    "rms_norm",
    "rms_norm_op",
    "silu_and_mul",
    "silu_and_mul_op",
]
