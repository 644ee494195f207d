"""Triton kernels of the model's elementwise layers: fused residual add + RMSNorm, SiLU * mul."""

from engine.models.triton_kernels.ops import add_rms_norm_op, rms_norm_op, silu_and_mul_op
from engine.models.triton_kernels.rms_norm import add_rms_norm, rms_norm
from engine.models.triton_kernels.silu_mul import silu_and_mul

__all__ = [
    "add_rms_norm",
    "add_rms_norm_op",
    "rms_norm",
    "rms_norm_op",
    "silu_and_mul",
    "silu_and_mul_op",
]
