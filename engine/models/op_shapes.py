"""Shape-only (fake) implementations of the model's custom ops, shared by the torch op
(:mod:`engine.models.kernels`) and the fused Triton op
(:mod:`engine.models.triton_kernels.custom_ops`): what ``torch.compile`` traces through."""

from __future__ import annotations

import torch


def moe_experts_fake(
    hidden: torch.Tensor,
    local_ids: torch.Tensor,
    rows_per_token: int,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_scale: torch.Tensor | None,
    down_scale: torch.Tensor | None,
    row_weights: torch.Tensor | None,
) -> torch.Tensor:
    """The output of any ``moe_experts`` op, shape and dtype only (the fused op's too)."""
    dtype = hidden.dtype if row_weights is None else torch.float32
    return hidden.new_empty((local_ids.shape[0], down_proj.shape[1]), dtype=dtype)
