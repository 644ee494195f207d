"""Token -> expert assignments grouped by expert and padded to the grouped GEMM's row blocks.

The fused MoE runs one GEMM over every (token, expert) row at once; each ``BLOCK_M`` row block
of that GEMM must belong to a single expert. :func:`align_rows_by_expert` lays the rows out that
way with torch ops only — no count is read back to the host — so its result lives on the device,
its shapes depend on the number of rows alone, and a CUDA graph can capture it.

Shapes are fixed by ``num_rows`` (N), ``num_local_experts`` (E) and ``block_m``: a non-empty
expert with ``c`` rows fills ``ceil(c / block_m)`` blocks, so at most
``ceil(N / block_m) + min(E, N)`` blocks are ever used; the tail beyond ``num_padded`` is idle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AlignedRows:
    """The grouped GEMM's row layout (all int64 tensors on the rows' device).

    ``sorted_row_ids`` [max_blocks * block_m]: the row id (``0..N-1``) each GEMM row reads,
    grouped by local expert in row order, each expert's group padded with ``N`` (no row) to a
    multiple of ``block_m``. ``block_expert_ids`` [max_blocks]: each block's local expert, -1
    past the used blocks. ``num_padded`` [1]: the number of GEMM rows in use.
    """

    sorted_row_ids: torch.Tensor
    block_expert_ids: torch.Tensor
    num_padded: torch.Tensor
    block_m: int


def max_num_blocks(num_rows: int, num_local_experts: int, block_m: int) -> int:
    """An upper bound on the row blocks :func:`align_rows_by_expert` fills."""
    return -(-num_rows // block_m) + min(num_local_experts, num_rows)


def align_rows_by_expert(
    local_ids: torch.Tensor, num_local_experts: int, block_m: int
) -> AlignedRows:
    """``local_ids`` [N] int64 local expert of each row (-1: not owned here, skipped) -> the
    rows grouped by expert and padded per expert to ``block_m``."""
    num_rows = local_ids.numel()
    device = local_ids.device
    num_blocks = max_num_blocks(num_rows, num_local_experts, block_m)
    # Unowned rows sort last under key E and land in a discarded slot.
    keys = torch.where(local_ids < 0, num_local_experts, local_ids)  # [N]
    counts = torch.zeros(num_local_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, keys, torch.ones_like(keys))  # [E + 1] (bincount would sync)
    blocks_per_expert = (counts[:num_local_experts] + block_m - 1) // block_m  # [E]
    block_ends = blocks_per_expert.cumsum(0)  # [E]
    padded_starts = (block_ends - blocks_per_expert) * block_m  # [E] first GEMM row per expert
    row_starts = counts.cumsum(0) - counts  # [E + 1] first sorted row per expert
    sorted_keys, order = keys.sort(stable=True)  # [N]
    rank = torch.arange(num_rows, device=device) - row_starts[sorted_keys]  # [N] within expert
    discard = num_blocks * block_m  # one slot past the end, dropped below
    padded_starts_ext = torch.cat([padded_starts, padded_starts.new_full((1,), discard)])
    dest = torch.where(
        sorted_keys < num_local_experts, padded_starts_ext[sorted_keys] + rank, discard
    )
    sorted_row_ids = torch.full((discard + 1,), num_rows, dtype=torch.int64, device=device)
    sorted_row_ids.scatter_(0, dest, order)
    block_ids = torch.arange(num_blocks, device=device)
    block_expert_ids = torch.searchsorted(block_ends, block_ids, right=True)  # [max_blocks]
    block_expert_ids = torch.where(block_expert_ids < num_local_experts, block_expert_ids, -1)
    num_padded = block_ends[-1:] * block_m if num_local_experts else counts[:1] * 0
    return AlignedRows(sorted_row_ids[:discard], block_expert_ids, num_padded, block_m)
