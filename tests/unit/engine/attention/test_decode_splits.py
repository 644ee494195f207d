"""The split-KV decode kernel's split count: fixed per batch size, one wave of SMs at most."""

from __future__ import annotations

import pytest
import torch

from engine.attention.triton_kernels.splits import (
    INTERPRETER_SM_COUNT,
    MAX_SPLITS,
    choose_num_splits,
    sm_count,
)

H100_SMS = 132


@pytest.mark.parametrize(
    ("num_seqs", "num_kv_heads", "expected"),
    [
        (1, 8, 16),  # llama-1b at batch 1: 8 programs -> 128
        (2, 8, 8),
        (4, 8, 4),
        (8, 8, 2),
        (16, 8, 1),  # 128 programs already: a second split would start a second wave
        (17, 8, 1),  # the batch alone fills the GPU
        (256, 8, 1),
        (1, 1, MAX_SPLITS),  # MQA at batch 1: capped
        (3, 4, 11),  # not a power of 2: the merge masks its tile
    ],
)
def test_splits_fill_one_wave(num_seqs: int, num_kv_heads: int, expected: int) -> None:
    num_splits = choose_num_splits(num_seqs, num_kv_heads, H100_SMS)
    assert num_splits == expected
    assert num_seqs * num_kv_heads * num_splits <= max(H100_SMS, num_seqs * num_kv_heads)


def test_splits_never_grow_with_the_batch() -> None:
    counts = [choose_num_splits(b, 8, H100_SMS) for b in range(1, 300)]
    assert counts == sorted(counts, reverse=True)
    assert all(1 <= c <= MAX_SPLITS for c in counts)


@pytest.mark.parametrize(
    ("num_seqs", "num_kv_heads", "num_sms"), [(0, 8, 132), (1, 0, 132), (1, 8, 0)]
)
def test_splits_refuse_empty_counts(num_seqs: int, num_kv_heads: int, num_sms: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        choose_num_splits(num_seqs, num_kv_heads, num_sms)


def test_sm_count_off_cuda_is_the_interpreter_stand_in() -> None:
    assert sm_count(torch.device("cpu")) == INTERPRETER_SM_COUNT
