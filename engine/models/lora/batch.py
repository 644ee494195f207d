"""The step's row -> adapter-slot mapping, built once per step and read by every LoRA linear.

A step's tokens are flattened request after request; each request runs under one adapter slot
(or none: the base model). :func:`build_lora_batch` groups the rows of each slot (SGMV's
segments): ``sorted_rows`` lists the step's adapter rows slot by slot, and group ``g`` is
``sorted_rows[group_starts[g] : group_starts[g] + group_lens[g]]`` under ``group_slots[g]``.
Rows of the base model are in no group and get no delta. A step of short groups (decode) also
gets a :class:`StackedRows`: the adapter rows in step order and a one-hot row -> slot matrix over
the span of slots present, which the torch path's stacked delta reads in every layer instead of
regrouping per linear. :class:`LoRAStepState` is the one object the runner writes the mapping
into and every LoRA linear of the model reads it from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.device_io import upload

BASE_SLOT = -1
"""The slot of a request without an adapter: no delta."""

MAX_STACKED_GROUP_LEN = 4
"""A step of two or more adapters none of which has more rows than this (decode) gets
:class:`StackedRows`; longer groups (prefill) are cheaper one matmul per group."""


@dataclass(frozen=True)
class StackedRows:
    """The adapter rows of a short-group step and their slots, for a delta over every slot of
    ``LoRABatch.slot_span`` at once."""

    rows: torch.Tensor | None  # [N] int64, in step order; None: every row of the step
    one_hot: torch.Tensor  # [N, span] float32: 1 in the column of the row's slot


@dataclass(frozen=True)
class LoRABatch:
    """Which rows of the step run under which adapter slot, on the model's device."""

    sorted_rows: torch.Tensor  # [N] int64: the adapter rows, grouped by slot
    group_slots: torch.Tensor  # [G] int32
    group_starts: torch.Tensor  # [G] int32: offsets into sorted_rows
    group_lens: torch.Tensor  # [G] int32
    max_group_len: int
    """Rows of the largest group (sizes the kernels' grids; known on the host)."""
    host_groups: tuple[tuple[int, int, int], ...]
    """``(slot, start, length)`` of every group: the torch path's loop, read on the host."""
    row_slots: torch.Tensor  # [N] int64: the slot of each of sorted_rows
    slot_span: tuple[int, int]
    """``(first, end)``: the range of slots the step's groups lie in."""
    stacked: StackedRows | None
    """Set when every group is short and there are several (see :data:`MAX_STACKED_GROUP_LEN`)."""

    @property
    def num_groups(self) -> int:
        """Adapters in the step."""
        return len(self.host_groups)


def build_lora_batch(
    num_tokens: Sequence[int], slots: Sequence[int], device: torch.device
) -> LoRABatch | None:
    """The mapping of a step whose request ``i`` runs ``num_tokens[i]`` consecutive rows under
    ``slots[i]`` (:data:`BASE_SLOT`: none); None when no request has an adapter."""
    rows_of: dict[int, list[int]] = {}
    row_order: list[tuple[int, int]] = []  # (row, slot) of every adapter row, in step order
    offset = 0
    for count, slot in zip(num_tokens, slots, strict=True):
        if slot != BASE_SLOT:
            rows_of.setdefault(slot, []).extend(range(offset, offset + count))
            row_order.extend((row, slot) for row in range(offset, offset + count))
        offset += count
    if not rows_of:
        return None
    sorted_rows: list[int] = []
    groups: list[tuple[int, int, int]] = []
    for slot in sorted(rows_of):
        groups.append((slot, len(sorted_rows), len(rows_of[slot])))
        sorted_rows.extend(rows_of[slot])
    span = (min(rows_of), max(rows_of) + 1)
    max_group_len = max(g[2] for g in groups)
    stacked = None
    if len(groups) > 1 and max_group_len <= MAX_STACKED_GROUP_LEN:
        stacked = _stacked_rows(row_order, offset, span, device)
    return LoRABatch(
        sorted_rows=upload(sorted_rows, torch.long, device),
        group_slots=upload([g[0] for g in groups], torch.int32, device),
        group_starts=upload([g[1] for g in groups], torch.int32, device),
        group_lens=upload([g[2] for g in groups], torch.int32, device),
        max_group_len=max_group_len,
        host_groups=tuple(groups),
        row_slots=upload([slot for slot, _, n in groups for _ in range(n)], torch.long, device),
        slot_span=span,
        stacked=stacked,
    )


def _stacked_rows(
    row_order: Sequence[tuple[int, int]],
    num_rows: int,
    span: tuple[int, int],
    device: torch.device,
) -> StackedRows:
    one_hot = [[0] * (span[1] - span[0]) for _ in row_order]
    for i, (_, slot) in enumerate(row_order):
        one_hot[i][slot - span[0]] = 1
    every_row = len(row_order) == num_rows
    return StackedRows(
        rows=None if every_row else upload([row for row, _ in row_order], torch.long, device),
        one_hot=upload(one_hot, torch.float32, device),
    )


class LoRAStepState:
    """The current step's :class:`LoRABatch` (None: no adapter rows), shared by a model's LoRA
    linears; the model runner sets it before each forward."""

    def __init__(self) -> None:
        self.batch: LoRABatch | None = None
