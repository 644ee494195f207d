"""CUDA-graph bucket choice and decode padding: pure arithmetic, checked on CPU."""

from __future__ import annotations

import pytest

from engine.cuda_graphs import (
    default_batch_sizes,
    graph_batch_sizes,
    moe_syncs_host,
    pad_decode,
    pick_bucket,
)
from engine.cuda_graphs.buckets import PADDING_ROW

ON = {
    "max_num_seqs": 64,
    "enforce_eager": False,
    "on_cuda": True,
    "backend_supports_graphs": True,
    "moe_syncs_host": False,
}


def test_default_batch_sizes() -> None:
    assert default_batch_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert default_batch_sizes(1) == (1,)
    assert default_batch_sizes(3) == (1, 2, 3)
    assert default_batch_sizes(12) == (1, 2, 4, 8, 12)
    assert default_batch_sizes(100)[-3:] == (88, 96, 100)
    with pytest.raises(ValueError, match="max_num_seqs"):
        default_batch_sizes(0)


def test_graphs_only_on_cuda_with_a_model_free_of_host_syncs() -> None:
    assert graph_batch_sizes(None, **ON) == default_batch_sizes(64)
    assert graph_batch_sizes([8, 1, 4], **ON) == (1, 4, 8)
    for off in (
        {"enforce_eager": True},
        {"on_cuda": False},
        {"backend_supports_graphs": False},
        {"moe_syncs_host": True},
    ):
        assert graph_batch_sizes([1, 2], **{**ON, **off}) == ()
        assert graph_batch_sizes(None, **{**ON, **off}) == ()


def test_only_a_single_rank_fused_moe_is_free_of_host_syncs() -> None:
    assert not moe_syncs_host(is_moe=True, fused_kernels=True, expert_parallel=False)
    assert moe_syncs_host(is_moe=True, fused_kernels=False, expert_parallel=False)  # torch loop
    assert moe_syncs_host(is_moe=True, fused_kernels=True, expert_parallel=True)  # all-to-all
    assert not moe_syncs_host(is_moe=False, fused_kernels=False, expert_parallel=True)


@pytest.mark.parametrize(
    ("num_seqs", "bucket"), [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (64, 64)]
)
def test_pick_bucket_takes_the_smallest_that_fits(num_seqs: int, bucket: int) -> None:
    assert pick_bucket(num_seqs, default_batch_sizes(64)) == bucket


def test_pick_bucket_none_when_nothing_fits() -> None:
    assert pick_bucket(65, default_batch_sizes(64)) is None
    assert pick_bucket(0, default_batch_sizes(64)) is None
    assert pick_bucket(3, [8, 2]) == 8  # unsorted sizes are fine


def test_pad_decode_lays_out_real_rows_then_padding() -> None:
    # block_size 4: contexts of 5, 1 and 9 tokens need 2, 1 and 3 blocks
    padded = pad_decode(
        [11, 12, 13], [5, 1, 9], [2, 2, 4], [3, 1, 2], bucket=4, block_size=4, max_table_width=10
    )
    assert padded.bucket == 4 and padded.num_seqs == 3 and padded.num_padding == 1
    assert padded.token_ids == [11, 12, 13, 0]
    assert padded.seq_lens == [5, 1, 9, 1]
    assert padded.rows == [3, 1, 2, PADDING_ROW]  # padding rows read the padding row


def test_pad_decode_full_bucket_has_no_padding() -> None:
    padded = pad_decode(
        [1, 2], [16, 17], [1, 2], [1, 2], bucket=2, block_size=16, max_table_width=2
    )
    assert padded.num_padding == 0 and padded.rows == [1, 2]


def test_pad_decode_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="bucket of 2"):
        pad_decode([1, 2, 3], [1, 1, 1], [1, 1, 1], [1, 2, 3], bucket=2, block_size=4,
                   max_table_width=4)  # fmt: skip
    with pytest.raises(ValueError, match="does not fit 1 blocks"):
        pad_decode([1], [5], [1], [1], bucket=1, block_size=4, max_table_width=4)
    with pytest.raises(ValueError, match="static table width 1"):
        pad_decode([1], [5], [2], [1], bucket=1, block_size=4, max_table_width=1)
    with pytest.raises(ValueError, match="one entry per sequence"):
        pad_decode([1, 2], [5], [2], [1], bucket=2, block_size=4, max_table_width=4)
    with pytest.raises(ValueError, match="bucket"):
        pad_decode([], [], [], [], bucket=2, block_size=4, max_table_width=4)
