"""The LoRA delta in torch ops: the CPU path and the reference the Triton kernels match.

A step of few rows per adapter (decode) takes every group at once: each row's A and B gathered
by its slot, one batched matmul per projection segment, so the op count does not grow with the
number of adapters in the batch. A step with long groups (prefill) loops over the groups, one
matmul each, rather than copying an adapter's weights per row."""

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
    if batch.max_group_len <= _MAX_GATHERED_GROUP_LEN and batch.num_groups > 1:
        _add_gathered(x, y, a, b, scales, segments, batch)
        return
    max_rank = b.shape[-1]
    for slot, start, length in batch.host_groups:
        rows = batch.sorted_rows[start : start + length]  # [n]
        shrunk = x.index_select(0, rows) @ a[slot].T  # [n, G * R]
        delta = torch.empty((length, y.shape[1]), dtype=y.dtype, device=y.device)  # [n, out]
        for j, (first, end) in enumerate(segments):
            part = shrunk[:, j * max_rank : (j + 1) * max_rank]  # [n, R]
            delta[:, first:end] = (part @ b[slot, first:end].T) * scales[slot].to(y.dtype)
        y.index_add_(0, rows, delta)


_MAX_GATHERED_GROUP_LEN = 4
"""Groups of at most this many rows take the gathered path (see the module docstring)."""


def _add_gathered(
    x: torch.Tensor,  # [T, in]
    y: torch.Tensor,  # [T, out]
    a: torch.Tensor,  # [S, G * R, in]
    b: torch.Tensor,  # [S, out, R]
    scales: torch.Tensor,  # [S] float32
    segments: Sequence[tuple[int, int]],
    batch: LoRABatch,
) -> None:
    max_rank = b.shape[-1]
    rows, slots = batch.sorted_rows, batch.row_slots  # [N], [N]
    xs = x.index_select(0, rows).unsqueeze(-1)  # [N, in, 1]
    shrunk = torch.bmm(a.index_select(0, slots), xs)  # [N, G * R, 1]
    b_rows = b.index_select(0, slots)  # [N, out, R]
    row_scales = scales.index_select(0, slots).to(y.dtype).unsqueeze(-1)  # [N, 1]
    delta = torch.empty((rows.shape[0], y.shape[1]), dtype=y.dtype, device=y.device)  # [N, out]
    for j, (first, end) in enumerate(segments):
        part = shrunk[:, j * max_rank : (j + 1) * max_rank]  # [N, R, 1]
        delta[:, first:end] = torch.bmm(b_rows[:, first:end], part).squeeze(-1) * row_scales
    y.index_add_(0, rows, delta)
