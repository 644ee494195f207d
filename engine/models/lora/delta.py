"""The LoRA delta in torch ops: the CPU path and the reference the Triton kernels match.

A step of short groups (decode, :class:`~engine.models.lora.batch.StackedRows` set) takes every
slot of the step's span at once, the op count independent of the number of adapters and no
adapter weights copied: one shrink of the rows against every slot's A, stacked
``[span * G * R, in]``; the product masked to each row's own slot (times its scale), and one
expand per segment against every slot's B, stacked ``[span * R, out]``. The expand's B is a view
when the slots keep B rank-major (:class:`~engine.models.lora.slots.LoRASlots` on the torch
path), a copy otherwise. A step with long groups (prefill) loops over the groups, one matmul
each, rather than multiplying every row by every slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.lora.batch import LoRABatch, StackedRows


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
    if batch.stacked is not None:
        _add_stacked(x, y, a, b, scales, segments, batch.slot_span, batch.stacked)
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


def _add_stacked(
    x: torch.Tensor,  # [T, in]
    y: torch.Tensor,  # [T, out]
    a: torch.Tensor,  # [S, G * R, in]
    b: torch.Tensor,  # [S, out, R]
    scales: torch.Tensor,  # [S] float32
    segments: Sequence[tuple[int, int]],
    slot_span: tuple[int, int],
    stacked: StackedRows,
) -> None:
    first_slot, end_slot = slot_span
    span, rank, num_segments = end_slot - first_slot, b.shape[-1], len(segments)
    xs = x if stacked.rows is None else x.index_select(0, stacked.rows)  # [N, in]
    num_rows = xs.shape[0]
    a_span = a[first_slot:end_slot].reshape(span * num_segments * rank, -1)  # [span*G*R, in]
    shrunk = (xs @ a_span.T).view(num_rows, span, num_segments, rank)  # [N, span, G, R]
    row_scales = (stacked.one_hot * scales[first_slot:end_slot]).to(y.dtype)  # [N, span]
    # NOTE: the mask zeroes every slot but the row's own, so the expand below sums only it
    masked = torch.empty(
        (num_rows, num_segments, span, rank), dtype=y.dtype, device=y.device
    )  # [N, G, span, R]
    torch.mul(shrunk.transpose(1, 2), row_scales.view(num_rows, 1, span, 1), out=masked)
    b_span = b[first_slot:end_slot].transpose(1, 2).reshape(span * rank, -1)  # [span*R, out]
    out = y  # every row of the step is an adapter row: the expand adds into y itself
    if stacked.rows is not None:
        out = torch.zeros((num_rows, y.shape[1]), dtype=y.dtype, device=y.device)  # [N, out]
    for j, (first, end) in enumerate(segments):
        expand = masked[:, j].view(num_rows, span * rank)  # [N, span * R]
        out[:, first:end].addmm_(expand, b_span[:, first:end])
    if stacked.rows is not None:
        y.index_add_(0, stacked.rows, out)
