"""The model's Triton kernels as torch custom ops, so ``torch.compile`` traces around them.

Dynamo cannot trace into a Triton launcher that reads strides and picks tile sizes in Python;
as opaque ops with a fake (shape-only) implementation they enter the graph as single nodes.
"""

from __future__ import annotations

import torch

from engine.models.op_shapes import moe_experts_fake
from engine.models.triton_kernels.fused_moe import fused_moe_experts
from engine.models.triton_kernels.rms_norm import add_rms_norm, rms_norm
from engine.models.triton_kernels.silu_mul import silu_and_mul


@torch.library.custom_op("pdserve::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[..., H] -> RMSNorm [..., H] (:func:`~engine.models.triton_kernels.rms_norm.rms_norm`)."""
    return rms_norm(x, weight, eps)


@rms_norm_op.register_fake
def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("pdserve::add_rms_norm", mutates_args=())
def add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual), both [..., H]."""
    return add_rms_norm(x, residual, weight, eps)


@add_rms_norm_op.register_fake
def _add_rms_norm_fake(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("pdserve::silu_and_mul", mutates_args=())
def silu_and_mul_op(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] -> silu(gate) * up [..., I]."""
    return silu_and_mul(gate_up)


@silu_and_mul_op.register_fake
def _silu_and_mul_fake(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


@torch.library.custom_op("pdserve::fused_moe_experts", mutates_args=())
def fused_moe_experts_op(
    hidden: torch.Tensor,
    local_ids: torch.Tensor,
    rows_per_token: int,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_scale: torch.Tensor | None,
    down_scale: torch.Tensor | None,
    row_weights: torch.Tensor | None,
) -> torch.Tensor:
    """The fused MoE experts
    (:func:`~engine.models.triton_kernels.fused_moe.fused_moe_experts`): [N, H]."""
    return fused_moe_experts(
        hidden,
        local_ids,
        rows_per_token,
        gate_up_proj,
        down_proj,
        gate_up_scale,
        down_scale,
        row_weights,
    )


fused_moe_experts_op.register_fake(moe_experts_fake)
