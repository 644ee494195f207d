"""One linear's adapter weights on the device, a slot per resident adapter, and its delta.

A linear may fuse several projections (QKV, gate/up): each is a *segment*, a range of the
output columns. Slot ``s`` holds every segment's A stacked by rows, ``a[s]`` [G * R, in]
(segment ``j``'s A in rows ``j*R : j*R + rank``, the rest zero) and B in its own output
columns, ``b[s]`` [out, R] (columns past the adapter's rank zero), plus the adapter's scale.
The Triton kernels read B row-major in that shape; the torch path keeps it rank-major
underneath (``b`` a transposed view). The delta of a row under slot ``s`` is
``scale * (x @ A_j^T) @ B_j^T`` written into segment ``j``'s columns: a shrink to ``G * R``
values, then one expand per segment. A segment the adapter does not target stays zero in that
slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.lora.batch import LoRAStepState
from engine.models.lora.delta import add_lora_delta_torch


class LoRASlots:
    """The device slots of one linear; :meth:`add_delta` applies the step's adapters."""

    def __init__(
        self,
        in_features: int,
        segments: Sequence[tuple[int, int]],
        *,
        num_slots: int,
        max_rank: int,
        step: LoRAStepState,
        fused: bool,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.segments = tuple(segments)  # (first column, end column) of each projection
        self.max_rank = max_rank
        self.step = step
        self.fused = fused  # the Triton shrink/expand kernels instead of the torch path
        out_features = self.segments[-1][1]
        rows = len(self.segments) * max_rank
        self.a = torch.zeros(num_slots, rows, in_features, dtype=dtype, device=device)
        # [S, out, R]; on the torch path a view of rank-major storage [S, R, out], so the
        # stacked delta's expand reads every slot's B as one [S * R, out] matrix, uncopied
        shape = (
            (num_slots, out_features, max_rank) if fused else (num_slots, max_rank, out_features)
        )
        b = torch.zeros(shape, dtype=dtype, device=device)
        self.b = b if fused else b.transpose(1, 2)
        self.scales = torch.zeros(num_slots, dtype=torch.float32, device=device)

    def set_slot(
        self,
        slot: int,
        weights: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
        scale: float,
    ) -> None:
        """Write an adapter into ``slot``: per segment ``(A [r, in], B [out_j, r])`` or None
        (not targeted); anything the slot held before is cleared."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        for j, pair in enumerate(weights):
            if pair is None:
                continue
            lora_a, lora_b = pair
            rank = lora_a.shape[0]
            first, end = self.segments[j]
            row = j * self.max_rank
            self.a[slot, row : row + rank].copy_(lora_a, non_blocking=True)
            self.b[slot, first:end, :rank].copy_(lora_b, non_blocking=True)
        self.scales[slot] = scale

    def add_delta(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """``y`` [T, out] += each adapter row's delta of ``x`` [T, in], in place."""
        batch = self.step.batch
        if batch is None:
            return
        if self.fused:
            from engine.models.triton_kernels.lora_sgmv import add_lora_delta_triton

            add_lora_delta_triton(x, y, self.a, self.b, self.scales, self.segments, batch)
            return
        add_lora_delta_torch(x, y, self.a, self.b, self.scales, self.segments, batch)
