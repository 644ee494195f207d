"""Switch a rank's MoE layers to a new expert placement, fetching new copies from their owners.

Collective: every rank of the gang calls :func:`apply_placement` at the same step boundary with
the same two placements (the stepper guarantees both). The primaries must not move, so the
weights of an expert a rank newly holds come from the expert's primary rank, over the gang's
collective: one all-to-all per expert tensor and MoE layer, rows of raw bytes (so int8 weights
and their scales travel alike). Nothing is read from the checkpoint and the copies are bit-equal
to the primary, so outputs stay token-identical. Experts a rank keeps are not moved; experts it
no longer holds are dropped. Requests, the scheduler and the KV cache are untouched.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from core.errors import ConfigError
from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.dispatch import ReplicaRouter
from engine.expert_parallel.install import ExpertParallelModel
from engine.expert_parallel.placement import ExpertPlacement
from engine.models.moe import MoELayer

EXPERT_TENSORS = ("gate_up_proj", "down_proj", "gate_up_scale", "down_scale")


def transfer_plan(
    old: ExpertPlacement, new: ExpertPlacement
) -> dict[tuple[int, int], tuple[int, ...]]:
    """``(source, destination)`` rank -> the experts (sorted) the destination newly holds under
    ``new`` whose primary is ``source``; pairs with nothing to move are left out."""
    if old.primary != new.primary:
        raise ConfigError("a rebalance must keep every expert's primary rank", param="placement")
    owner = {e: r for r, ids in enumerate(new.primary) for e in ids}
    plan: dict[tuple[int, int], list[int]] = {}
    for rank in range(new.num_ranks):
        for expert_id in sorted(set(new.experts_of(rank)) - set(old.experts_of(rank))):
            plan.setdefault((owner[expert_id], rank), []).append(expert_id)
    return {pair: tuple(ids) for pair, ids in plan.items()}


@torch.no_grad()
def apply_placement(
    ep_model: ExpertParallelModel,
    collective: EPCollective,
    old: ExpertPlacement,
    new: ExpertPlacement,
) -> int:
    """Make this rank hold ``new.experts_of(rank)`` in every MoE layer and route by ``new``.

    Returns the bytes this rank received. Collective (see the module docstring).
    """
    rank, world = collective.rank, collective.world_size
    plan = transfer_plan(old, new)
    send_ids = [plan.get((rank, dst), ()) for dst in range(world)]
    recv_ids = [plan.get((src, rank), ()) for src in range(world)]
    held = new.experts_of(rank)
    device = ep_model.model.embed_tokens.weight.device
    router = ReplicaRouter(new, rank, device)
    received_bytes = 0
    for layer in ep_model.layers:
        received_bytes += _reshard_layer(layer.moe, collective, send_ids, recv_ids, held)
        layer.router = router
    ep_model.stats.held_expert_ids = held
    return received_bytes


def _reshard_layer(
    moe: MoELayer,
    collective: EPCollective,
    send_ids: list[tuple[int, ...]],
    recv_ids: list[tuple[int, ...]],
    held: tuple[int, ...],
) -> int:
    """Swap one layer's expert tensors for ``held``'s, fetching the missing ones; bytes in."""
    flat_send = [e for ids in send_ids for e in ids]
    flat_recv = [e for ids in recv_ids for e in ids]
    send_local = moe.global_to_local[torch.tensor(flat_send, dtype=torch.int64)].tolist()
    received_bytes = 0
    for name in EXPERT_TENSORS:
        current = getattr(moe, name, None)
        if current is None:
            continue
        fetched = _exchange_rows(current, send_local, send_ids, recv_ids, collective)
        received_bytes += fetched.numel() * fetched.element_size()
        rows = {e: fetched[i] for i, e in enumerate(flat_recv)}
        for local_id, expert_id in enumerate(moe.expert_ids):
            rows.setdefault(expert_id, current[local_id])
        stacked = torch.stack([rows[e] for e in held])  # [E_new, ...]
        if isinstance(current, nn.Parameter):
            setattr(moe, name, nn.Parameter(stacked, requires_grad=False))
        else:
            moe.register_buffer(name, stacked)
    to_local = torch.full_like(moe.global_to_local, -1)  # [E]
    to_local[list(held)] = torch.arange(len(held), device=to_local.device)
    moe.register_buffer("global_to_local", to_local, persistent=False)
    moe.expert_ids = held
    return received_bytes


def _exchange_rows(
    tensor: torch.Tensor,
    send_local: list[int],
    send_ids: list[tuple[int, ...]],
    recv_ids: list[tuple[int, ...]],
    collective: EPCollective,
) -> torch.Tensor:
    """Send ``tensor[send_local]`` (per-expert rows) as bytes; the rows received [M, ...]."""
    shape, dtype = tensor.shape[1:], tensor.dtype
    rows = tensor[send_local].contiguous()  # [n, ...] ordered by destination rank
    row_bytes = math.prod(shape) * tensor.element_size()
    as_bytes = rows.view(torch.uint8).reshape(len(send_local), row_bytes)  # [n, bytes]
    got = collective.all_to_all(
        as_bytes, [len(ids) for ids in send_ids], [len(ids) for ids in recv_ids]
    )  # [M, bytes]
    return got.view(dtype).reshape(got.shape[0], *shape)  # [M, ...]
