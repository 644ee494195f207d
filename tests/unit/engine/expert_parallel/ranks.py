"""Helpers for the expert-parallel tests: thread ranks, random MoE layers split by placement."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from engine.builtin.specs import BUILTIN_SPECS
from engine.expert_parallel import InProcCollective, InProcGroup
from engine.models.config import ModelArchConfig
from engine.models.moe import MoELayer

T = TypeVar("T")
HIDDEN = 32


def moe_config(
    num_experts: int, top_k: int, *, shared: int = 0, renormalize: bool = False
) -> ModelArchConfig:
    """A small MoE shape (hidden 32) on top of the built-in tiny-moe config."""
    base = ModelArchConfig.from_hf_dict(BUILTIN_SPECS["tiny-moe"].config)
    return dataclasses.replace(
        base,
        hidden_size=HIDDEN,
        num_experts=num_experts,
        top_k=top_k,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=shared,
        norm_topk_prob=renormalize,
    )


def random_dense_layer(config: ModelArchConfig, seed: int = 0) -> MoELayer:
    """A MoE layer holding every expert, with seeded random weights (~ N / sqrt(fan_in))."""
    layer = MoELayer(config, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in layer.parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(noise / param.shape[-1] ** 0.5)
    return layer


def rank_layer(dense: MoELayer, config: ModelArchConfig, expert_ids: tuple[int, ...]) -> MoELayer:
    """A layer holding only ``expert_ids``, with ``dense``'s weights for them (as a rank loads)."""
    layer = MoELayer(config, dtype=torch.float32, device="cpu", expert_ids=expert_ids)
    with torch.no_grad():
        dense_params = dict(dense.named_parameters())
        for name, param in layer.named_parameters():
            source: torch.Tensor = dense_params[name]
            if name in ("gate_up_proj", "down_proj"):
                source = source[list(expert_ids)]  # [E_local, ...] this rank's experts only
            param.copy_(source)
    return layer


def run_ranks(
    world_size: int, fn: Callable[[InProcCollective], T], *, timeout_s: float = 20.0
) -> list[T]:
    """Run ``fn(collective)`` on ``world_size`` thread ranks; results in rank order."""
    group = InProcGroup(world_size, timeout_s=timeout_s)
    with ThreadPoolExecutor(max_workers=world_size) as pool:
        futures = [pool.submit(fn, group.member(rank)) for rank in range(world_size)]
        return [future.result(timeout=timeout_s * 4) for future in futures]
