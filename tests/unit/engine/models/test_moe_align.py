"""The fused MoE's row layout: rows grouped by expert, padded per expert to the GEMM's blocks."""

from __future__ import annotations

import pytest
import torch

from engine.models.triton_kernels import align_rows_by_expert
from engine.models.triton_kernels.moe_align import max_num_blocks

PAD = 7  # the padding id is the number of rows


def test_rows_grouped_by_expert_in_row_order_and_padded() -> None:
    local_ids = torch.tensor([3, 0, 3, -1, 1, 3, 0])  # row 3's expert is not owned here
    aligned = align_rows_by_expert(local_ids, num_local_experts=4, block_m=4)
    assert aligned.sorted_row_ids.tolist() == [
        *[1, 6, PAD, PAD],  # expert 0
        *[4, PAD, PAD, PAD],  # expert 1; expert 2 got no rows and takes no block
        *[0, 2, 5, PAD],  # expert 3
        *[PAD] * 12,  # unused blocks up to the bound ceil(7 / 4) + min(4, 7) = 6
    ]
    assert aligned.block_expert_ids.tolist() == [0, 1, 3, -1, -1, -1]
    assert aligned.num_padded.tolist() == [12]
    assert aligned.block_m == 4


def test_a_full_block_takes_no_padding() -> None:
    aligned = align_rows_by_expert(torch.tensor([1, 1, 0, 1, 1]), 2, block_m=2)
    assert aligned.sorted_row_ids.tolist()[:6] == [2, 5, 0, 1, 3, 4]
    assert aligned.block_expert_ids.tolist()[:3] == [0, 1, 1]
    assert aligned.num_padded.tolist() == [6]


def test_no_owned_rows_and_no_rows() -> None:
    aligned = align_rows_by_expert(torch.tensor([-1, -1]), 3, block_m=16)
    assert aligned.num_padded.tolist() == [0]
    assert (aligned.sorted_row_ids == 2).all() and (aligned.block_expert_ids == -1).all()
    empty = align_rows_by_expert(torch.empty(0, dtype=torch.int64), 3, block_m=16)
    assert empty.num_padded.tolist() == [0] and empty.block_expert_ids.numel() == 0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block_m", [1, 16, 64])
def test_random_layouts_hold_every_owned_row_once(seed: int, block_m: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_rows, num_experts = 200, 16
    local_ids = torch.randint(-1, num_experts, (num_rows,), generator=gen)
    aligned = align_rows_by_expert(local_ids, num_experts, block_m)
    num_blocks = max_num_blocks(num_rows, num_experts, block_m)
    assert aligned.sorted_row_ids.shape == (num_blocks * block_m,)
    assert aligned.block_expert_ids.shape == (num_blocks,)
    used = int(aligned.num_padded.item())
    assert used % block_m == 0
    blocks = aligned.sorted_row_ids[:used].view(-1, block_m)  # [used blocks, block_m]
    experts = aligned.block_expert_ids[: used // block_m]
    assert (experts >= 0).all() and (aligned.block_expert_ids[used // block_m :] == -1).all()
    assert (experts.diff() >= 0).all()  # blocks in expert order
    real = blocks < num_rows
    assert (local_ids[blocks[real]] == experts[:, None].expand_as(blocks)[real]).all()
    assert sorted(blocks[real].tolist()) == (local_ids >= 0).nonzero().squeeze(1).tolist()
    assert (aligned.sorted_row_ids[used:] == num_rows).all()
    for block in blocks:  # each block: its rows in row order, then padding
        rows = block[block < num_rows]
        assert (rows.diff() > 0).all() and (block[: len(rows)] < num_rows).all()
