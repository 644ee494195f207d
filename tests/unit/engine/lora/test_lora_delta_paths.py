"""The torch LoRA delta's two paths — rows gathered by slot (few rows per adapter) and a loop
over the groups (long groups) — both equal the delta written out row by row."""

from __future__ import annotations

import pytest
import torch

from engine.models.lora.batch import BASE_SLOT, build_lora_batch
from engine.models.lora.delta import add_lora_delta_torch

RANK, IN, SEGMENTS = 4, 12, ((0, 6), (6, 10))  # two segments: outputs 0-5 and 6-9


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


@pytest.mark.parametrize(
    ("counts", "slots"),
    [
        ([1, 1, 1, 1, 1], [2, 0, BASE_SLOT, 1, 0]),  # decode: gathered
        ([5, 3, 6], [1, BASE_SLOT, 0]),  # prefill: the group loop
    ],
)
def test_both_paths_equal_the_row_by_row_delta(counts: list[int], slots: list[int]) -> None:
    generator = torch.Generator().manual_seed(0)
    num_rows = sum(counts)
    x = torch.randn(num_rows, IN, generator=generator)
    a = torch.randn(3, len(SEGMENTS) * RANK, IN, generator=generator)
    b = torch.randn(3, 10, RANK, generator=generator)
    scales = torch.tensor([0.5, 2.0, 1.0])
    batch = build_lora_batch(counts, slots, torch.device("cpu"))
    assert batch is not None
    y = torch.zeros(num_rows, 10)
    add_lora_delta_torch(x, y, a, b, scales, SEGMENTS, batch)
    row_slots = [slot for count, slot in zip(counts, slots, strict=True) for _ in range(count)]
    reference = expected(x, a, b, scales, row_slots).float()  # fp32 rounding of fp64 math
    torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)
