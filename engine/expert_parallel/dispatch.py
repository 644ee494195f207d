"""Dispatch bookkeeping of one MoE layer on one rank: which row goes where, what comes back.

A step's routing gives ``T * k`` rows (token ``t``'s hidden state once per chosen expert, in
token-major slot order ``t * k + j``). :func:`plan_dispatch` picks each row's destination rank
from the :class:`ReplicaRouter`, orders rows by (destination, expert) and exchanges the
[ranks, experts] count matrix with the peers — one small all-to-all — so that every rank knows
how many rows it will receive from whom and, because rows arrive sorted by expert, the expert id
of every received row without sending ids. The same layout, reversed, brings results home.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.placement import ExpertPlacement


class ReplicaRouter:
    """One sender rank's replica table as tensors: expert -> candidate destination ranks."""

    def __init__(self, placement: ExpertPlacement, rank: int, device: torch.device) -> None:
        table = placement.replica_table(rank)
        width = max(len(ranks) for ranks in table)
        padded = [[ranks[i % len(ranks)] for i in range(width)] for ranks in table]
        self.num_experts = placement.num_experts
        self.world_size = placement.num_ranks
        self.table = torch.tensor(padded, dtype=torch.int64, device=device)  # [E, C]
        self.num_copies = torch.tensor(
            [len(ranks) for ranks in table], dtype=torch.int64, device=device
        )  # [E]

    def destinations(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """``topk_ids`` [T, k] global expert ids -> [T * k] destination rank of every row."""
        flat_ids = topk_ids.reshape(-1)  # [T*k]
        token_idx = torch.arange(flat_ids.numel(), device=flat_ids.device) // topk_ids.shape[1]
        pick = token_idx % self.num_copies[flat_ids]  # [T*k] which copy: round-robin by token
        return self.table[flat_ids, pick]  # [T*k]


@dataclass(frozen=True)
class DispatchLayout:
    """One rank's rows of one MoE layer for one step, and what it receives from its peers."""

    order: torch.Tensor  # [T*k] slot ids sorted by (destination rank, expert id)
    send_splits: list[int]  # [R] rows sent to each rank, in ``order``
    recv_splits: list[int]  # [R] rows received from each rank
    recv_expert_ids: torch.Tensor  # [M] global expert id of every received row
    send_counts: torch.Tensor  # [R, E] int64 CPU: rows sent per (destination, expert)
    recv_counts: torch.Tensor  # [R, E] int64 CPU: rows received per (source, expert)

    @property
    def num_sent_rows(self) -> int:
        """Rows this rank dispatches (``T * k``)."""
        return sum(self.send_splits)

    @property
    def num_recv_rows(self) -> int:
        """Rows this rank's experts compute (``M``)."""
        return sum(self.recv_splits)


def plan_dispatch(
    topk_ids: torch.Tensor, router: ReplicaRouter, collective: EPCollective
) -> DispatchLayout:
    """Order this rank's rows by destination and exchange row counts with every peer.

    ``topk_ids`` [T, k] global expert ids (T may be 0: an empty step still takes part).
    """
    num_ranks, num_experts = router.world_size, router.num_experts
    flat_ids = topk_ids.reshape(-1)  # [T*k]
    key = router.destinations(topk_ids) * num_experts + flat_ids  # [T*k] (rank, expert) bucket
    order = key.argsort(stable=True)  # [T*k]
    send_counts = torch.bincount(key, minlength=num_ranks * num_experts)  # [R*E]
    recv_counts = collective.all_to_all(
        send_counts, [num_experts] * num_ranks, [num_experts] * num_ranks
    )  # [R*E]: rank r's counts for this rank
    send_cpu = send_counts.view(num_ranks, num_experts).cpu()  # [R, E]
    recv_cpu = recv_counts.view(num_ranks, num_experts).cpu()  # [R, E]
    recv_splits = recv_cpu.sum(dim=1).tolist()  # [R]
    expert_of_bucket = torch.arange(num_experts, device=flat_ids.device).repeat(num_ranks)
    recv_expert_ids = expert_of_bucket.repeat_interleave(
        recv_counts, output_size=sum(recv_splits)
    )  # [M], no device sync: M is known on the host
    return DispatchLayout(
        order=order,
        send_splits=send_cpu.sum(dim=1).tolist(),
        recv_splits=recv_splits,
        recv_expert_ids=recv_expert_ids,
        send_counts=send_cpu,
        recv_counts=recv_cpu,
    )
