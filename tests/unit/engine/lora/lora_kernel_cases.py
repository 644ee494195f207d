"""The Triton shrink/expand kernels against the torch path, on small shapes.

Not collected directly (no ``test_`` prefix): ``test_lora_interpreter.py`` runs this file in a
fresh process with ``TRITON_INTERPRET=1``. By hand on CPU:
``TRITON_INTERPRET=1 .venv/bin/pytest tests/unit/engine/lora/lora_kernel_cases.py``.
"""

from __future__ import annotations

import pytest
import torch

from engine.models.lora.batch import BASE_SLOT, build_lora_batch
from engine.models.lora.delta import add_lora_delta_torch
from engine.models.triton_kernels.lora_sgmv import add_lora_delta_triton

CASES = [
    # (segments' widths, in, rank, slots, per-request (tokens, slot))
    ((64,), 48, 8, 2, [(5, 0), (3, BASE_SLOT), (17, 1)]),
    ((64, 32, 32), 64, 16, 4, [(1, 2), (1, 0), (1, BASE_SLOT), (1, 3), (1, 2)]),
    ((96, 96), 64, 8, 3, [(33, 1), (2, 0), (4, 1), (1, BASE_SLOT)]),
    ((40,), 72, 1, 1, [(3, 0)]),
    ((64,), 96, 64, 2, [(20, 1), (7, 0)]),
]


@pytest.mark.parametrize(("widths", "in_features", "rank", "num_slots", "requests"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_the_torch_path(
    widths: tuple[int, ...],
    in_features: int,
    rank: int,
    num_slots: int,
    requests: list[tuple[int, int]],
    dtype: torch.dtype,
) -> None:
    generator = torch.Generator().manual_seed(0)
    segments, first = [], 0
    for width in widths:
        segments.append((first, first + width))
        first += width
    num_tokens = sum(count for count, _ in requests)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    x = rand(num_tokens, in_features)
    y = rand(num_tokens, first)
    a = rand(num_slots, len(widths) * rank, in_features)
    b = rand(num_slots, first, rank)
    scales = torch.rand(num_slots, generator=generator) + 0.5
    batch = build_lora_batch(
        [count for count, _ in requests], [slot for _, slot in requests], torch.device("cpu")
    )
    assert batch is not None
    expected, got = y.clone(), y.clone()
    add_lora_delta_torch(x, expected, a, b, scales, segments, batch)
    add_lora_delta_triton(x, got, a, b, scales, segments, batch)
    base_rows = []
    offset = 0
    for count, slot in requests:
        if slot == BASE_SLOT:
            base_rows.extend(range(offset, offset + count))
        offset += count
    assert torch.equal(got[base_rows], y[base_rows])  # the base rows are untouched
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol * 10, rtol=tol)
    assert not torch.equal(got, y)  # the kernels did write a delta


def test_no_adapter_rows_is_no_batch() -> None:
    assert build_lora_batch([3, 4], [BASE_SLOT, BASE_SLOT], torch.device("cpu")) is None
