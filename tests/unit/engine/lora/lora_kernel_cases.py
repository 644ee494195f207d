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


def test_a_fused_linear_with_slots_matches_the_torch_one() -> None:
    """Through ``Linear`` and ``LoRASlots.set_slot``: adapters of ranks below the slots' rank,
    one of them leaving a segment untargeted, the kernels against the torch path."""
    from engine.models.layers import Linear
    from engine.models.lora import LoRASlots, LoRAStepState

    generator = torch.Generator().manual_seed(1)
    segments = [(0, 32), (32, 48), (48, 64)]  # a q/k/v-like fused projection
    step = LoRAStepState()
    outputs = []
    for fused in (False, True):
        linear = Linear(40, 64, bias=True, dtype=torch.float32, device="cpu")
        slots = LoRASlots(
            40,
            segments,
            num_slots=2,
            max_rank=16,
            step=step,
            fused=fused,
            dtype=torch.float32,
            device="cpu",
        )
        generator.manual_seed(1)
        linear.weight.data.copy_(torch.randn(64, 40, generator=generator))
        linear.bias.data.copy_(torch.randn(64, generator=generator))  # type: ignore[union-attr]
        for slot, rank in ((0, 8), (1, 4)):
            weights: list[tuple[torch.Tensor, torch.Tensor] | None] = []
            for first, end in segments:
                lora_a = torch.randn(rank, 40, generator=generator)
                weights.append((lora_a, torch.randn(end - first, rank, generator=generator)))
            weights[1] = None if slot == 1 else weights[1]  # slot 1 leaves k alone
            slots.set_slot(slot, weights, scale=0.5 * (slot + 1))
        linear.lora = slots
        step.batch = build_lora_batch([3, 2, 4], [1, BASE_SLOT, 0], torch.device("cpu"))
        x = torch.randn(9, 40, generator=generator)
        outputs.append(linear(x))
        step.batch = None
        plain = linear(x)
        assert torch.equal(outputs[-1][3:5], plain[3:5])  # base rows: no delta
        assert torch.equal(outputs[-1][0:3, 32:48], plain[0:3, 32:48])  # slot 1's k untouched
        assert not torch.equal(outputs[-1][5:], plain[5:])
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-4, rtol=1e-4)
