"""Skewed MoE routing for load-balancing experiments: a router bias that sends most tokens to a
few chosen experts, so one rank of a gang computes most routed rows (the EPLB benchmark and the
rebalancing tests make their hot experts with it)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.moe import MoELayer


def skew_routing(model: torch.nn.Module, hot_expert_ids: Sequence[int], logit_bias: float) -> int:
    """Bias every MoE router of ``model`` by ``logit_bias`` towards ``hot_expert_ids`` (the same
    on every rank, as router weights are replicated). Returns the number of routers changed."""
    routers = [layer.gate for layer in model.modules() if isinstance(layer, MoELayer)]
    for gate in routers:
        bias = torch.zeros(gate.weight.shape[0], dtype=gate.weight.dtype)  # [E]
        bias[list(hot_expert_ids)] = logit_bias
        gate.bias = torch.nn.Parameter(bias.to(gate.weight.device), requires_grad=False)
    return len(routers)
