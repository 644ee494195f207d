"""The torch LoRA delta's two paths — every slot of the step's span stacked (short groups, as in
decode) and a loop over the groups (long groups) — both equal the delta written out row by row,
whichever layout B is kept in."""

from __future__ import annotations

import pytest
import torch

from engine.models.lora import LoRASlots, LoRAStepState
from engine.models.lora.batch import BASE_SLOT, build_lora_batch
from engine.models.lora.delta import add_lora_delta_torch

RANK, IN, SEGMENTS = 4, 12, ((0, 6), (6, 10))  # two segments: outputs 0-5 and 6-9
NUM_SLOTS = 6


def expected(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor,
             row_slots: list[int]) -> torch.Tensor:  # fmt: skip
    y = torch.zeros(x.shape[0], 10, dtype=torch.float64)
    for row, slot in enumerate(row_slots):
        if slot == BASE_SLOT:
            continue
        for j, (first, end) in enumerate(SEGMENTS):
            a_j = a[slot, j * RANK : (j + 1) * RANK].double()  # [R, in]
            b_j = b[slot, first:end].double()  # [out_j, R]
            y[row, first:end] = scales[slot].double() * (b_j @ (a_j @ x[row].double()))
    return y


CASES = [
    ([1, 1, 1, 1, 1], [2, 0, BASE_SLOT, 1, 0], True),  # decode with a base row: stacked
    ([1, 1, 2, 1], [5, 3, 5, 4], True),  # every row an adapter row, slots 3-5 only: stacked
    ([1, 1, 1], [4, BASE_SLOT, 1], True),  # slot 2 and 3 absent inside the span
    ([5, 3, 6], [1, BASE_SLOT, 0], False),  # prefill: the group loop
    ([1, 1, 1], [3, BASE_SLOT, 3], False),  # one adapter: the group loop
]


@pytest.mark.parametrize(("counts", "slots", "stacked"), CASES)
@pytest.mark.parametrize("rank_major_b", [False, True])
def test_both_paths_equal_the_row_by_row_delta(
    counts: list[int], slots: list[int], stacked: bool, rank_major_b: bool
) -> None:
    generator = torch.Generator().manual_seed(0)
    num_rows = sum(counts)
    x = torch.randn(num_rows, IN, generator=generator)
    a = torch.randn(NUM_SLOTS, len(SEGMENTS) * RANK, IN, generator=generator)
    b = torch.randn(NUM_SLOTS, 10, RANK, generator=generator)
    if rank_major_b:  # LoRASlots' torch-path layout: a transposed view of [S, R, out]
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    scales = torch.tensor([0.5, 2.0, 1.0, 0.25, 3.0, 1.5])
    batch = build_lora_batch(counts, slots, torch.device("cpu"))
    assert batch is not None
    assert (batch.stacked is not None) is stacked
    y = torch.randn(num_rows, 10, generator=generator)
    before = y.clone()
    add_lora_delta_torch(x, y, a, b, scales, SEGMENTS, batch)
    row_slots = [slot for count, slot in zip(counts, slots, strict=True) for _ in range(count)]
    reference = expected(x, a, b, scales, row_slots).float()  # fp32 rounding of fp64 math
    torch.testing.assert_close(y - before, reference, rtol=1e-5, atol=1e-5)
    base_rows = [row for row, slot in enumerate(row_slots) if slot == BASE_SLOT]
    assert torch.equal(y[base_rows], before[base_rows])  # base rows: untouched


def test_a_stacked_step_names_its_rows_slots_and_span() -> None:
    every = build_lora_batch([1, 1, 1], [4, 2, 4], torch.device("cpu"))
    assert every is not None and every.stacked is not None
    assert every.slot_span == (2, 5)
    assert every.stacked.rows is None  # every row is an adapter row: no gather
    assert every.stacked.one_hot.tolist() == [[0, 0, 1], [1, 0, 0], [0, 0, 1]]
    mixed = build_lora_batch([1, 1, 1], [3, BASE_SLOT, 1], torch.device("cpu"))
    assert mixed is not None and mixed.stacked is not None
    assert mixed.stacked.rows is not None and mixed.stacked.rows.tolist() == [0, 2]
    assert mixed.stacked.one_hot.tolist() == [[0, 0, 1], [1, 0, 0]]
    prefill = build_lora_batch([5, 1], [0, 1], torch.device("cpu"))
    assert prefill is not None and prefill.stacked is None  # a long group: the loop


def test_slots_keep_b_rank_major_on_the_torch_path_and_row_major_for_the_kernels() -> None:
    step = LoRAStepState()
    torch_path, kernels = (
        LoRASlots(
            IN,
            SEGMENTS,
            num_slots=2,
            max_rank=4,
            step=step,
            fused=fused,
            dtype=torch.float32,
            device="cpu",
        )
        for fused in (False, True)
    )
    assert torch_path.b.shape == kernels.b.shape == (2, 10, 4)
    assert torch_path.b.transpose(1, 2).is_contiguous()  # [S, R, out] underneath
    assert kernels.b.is_contiguous()  # the Triton kernels' [S, out, R]
    generator = torch.Generator().manual_seed(2)
    weights = [
        (torch.randn(3, IN, generator=generator), torch.randn(end - first, 3, generator=generator))
        for first, end in SEGMENTS
    ]
    for slots in (torch_path, kernels):
        slots.set_slot(1, weights, scale=0.5)
    assert torch.equal(torch_path.b, kernels.b)
    assert torch.equal(torch_path.a, kernels.a)
