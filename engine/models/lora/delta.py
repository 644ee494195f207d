"""The LoRA delta in torch ops: the CPU path and the reference the Triton kernels match."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.lora.batch import LoRABatch


def add_lora_delta_torch(
    x: torch.Tensor,  # [T, in]
    y: torch.Tensor,  # [T, out]
    a: torch.Tensor,  # [S, G * R, in]
    b: torch.Tensor,  # [S, out, R]
    scales: torch.Tensor,  # [S] float32
    segments: Sequence[tuple[int, int]],
    batch: LoRABatch,
) -> None:
    """``y[rows of slot s, segment j] += scale_s * (x[rows] @ A_sj^T) @ B_sj^T`` for every
    group of ``batch``, in place; rows of the base model are left alone."""
    max_rank = b.shape[-1]
    for slot, start, length in batch.host_groups:
        rows = batch.sorted_rows[start : start + length]  # [n]
        shrunk = x.index_select(0, rows) @ a[slot].T  # [n, G * R]
        delta = torch.empty((length, y.shape[1]), dtype=y.dtype, device=y.device)  # [n, out]
        for j, (first, end) in enumerate(segments):
            part = shrunk[:, j * max_rank : (j + 1) * max_rank]  # [n, R]
            delta[:, first:end] = (part @ b[slot, first:end].T) * scales[slot].to(y.dtype)
        y.index_add_(0, rows, delta)
