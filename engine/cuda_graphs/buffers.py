"""The static tensors a captured decode graph reads: inputs plus attention metadata.

A CUDA graph replays the kernels it recorded with the *addresses* it recorded, so every input
of a decode step lives in a buffer allocated once, sized for the largest bucket: token ids,
context lengths and block-table rows come from the host (:meth:`DecodeBuffers.load`, three small
pinned copies), and positions, the step's block tables and slot mapping are derived from them on
the device (:meth:`DecodeBuffers.derive`, recorded inside the graph) from the persistent block
table (:mod:`engine.cuda_graphs.block_table_rows`). :meth:`DecodeBuffers.metadata` hands the
graph views of the first ``bucket`` rows. Device-agnostic: on a CPU the same class backs the
unit tests of the arithmetic.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.cuda_graphs.buckets import (
    PADDING_ROW,
    PADDING_SEQ_LEN,
    PADDING_SLOT,
    PaddedDecode,
)
from engine.device_io import stage


class DecodeBuffers:
    """Static decode inputs for up to ``max_batch`` rows and ``max_table_width`` blocks a row."""

    def __init__(
        self, max_batch: int, max_table_width: int, block_size: int, device: torch.device
    ) -> None:
        self.max_batch = max_batch
        self.max_table_width = max_table_width
        self.block_size = block_size
        self.device = device
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)  # [Bmax]
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)  # [Bmax]
        self.seq_lens = torch.full(  # [Bmax]
            (max_batch,), PADDING_SEQ_LEN, dtype=torch.int32, device=device
        )
        self.rows = torch.full(  # [Bmax], each row's row of the persistent block table
            (max_batch,), PADDING_ROW, dtype=torch.long, device=device
        )
        self.slot_mapping = torch.full(  # [Bmax]
            (max_batch,), PADDING_SLOT, dtype=torch.long, device=device
        )
        self.block_tables = torch.zeros(  # [Bmax, W]
            (max_batch, max_table_width), dtype=torch.int32, device=device
        )
        # One query token per row: the cumulative query lengths never change.
        self.query_start_loc = torch.arange(  # [Bmax + 1]
            max_batch + 1, dtype=torch.int32, device=device
        )
        self.all_rows = torch.arange(max_batch, dtype=torch.long, device=device)  # [Bmax]

    def metadata(self, bucket: int) -> AttentionMetadata:
        """Attention metadata over the first ``bucket`` rows of the static buffers.

        NOTE: the host mirrors (``seq_lens_list``) hold placeholders: a graph replays with
        whatever lengths :meth:`load` wrote, so a backend used under a graph must read lengths
        from the tensors only (``AttentionBackend.supports_cuda_graphs``).
        """
        self._check_bucket(bucket)
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: bucket + 1],
            seq_lens=self.seq_lens[:bucket],
            block_tables=self.block_tables[:bucket],
            slot_mapping=self.slot_mapping[:bucket],
            query_lens_list=(1,) * bucket,
            seq_lens_list=(PADDING_SEQ_LEN,) * bucket,
            block_size=self.block_size,
        )

    def load(self, padded: PaddedDecode) -> None:
        """Copy a padded step's host values into the first ``padded.bucket`` rows (pinned
        host -> device copies, in stream order; nothing waits)."""
        bucket = padded.bucket
        self._check_bucket(bucket)
        self._put(self.input_ids[:bucket], padded.token_ids)
        self._put(self.seq_lens[:bucket], padded.seq_lens)
        self._put(self.rows[:bucket], padded.rows)

    def derive(self, bucket: int, table: torch.Tensor) -> None:
        """Fill positions, block tables and slots of the first ``bucket`` rows from the loaded
        lengths and rows and the persistent block ``table`` [rows, W], on the device.

        Recorded inside a decode graph: every tensor it touches has a fixed address."""
        self._check_bucket(bucket)
        if table.shape[1] != self.max_table_width:
            raise ValueError(
                f"a block table {table.shape[1]} wide does not match the static width "
                f"{self.max_table_width}"
            )
        rows = self.rows[:bucket]  # [b]
        torch.index_select(table, 0, rows, out=self.block_tables[:bucket])  # [b, W]
        positions = self.seq_lens[:bucket].long() - 1  # [b]
        self.positions[:bucket].copy_(positions)
        blocks = self.block_tables[:bucket].gather(1, (positions // self.block_size)[:, None])
        slots = blocks.squeeze(1).long() * self.block_size + positions % self.block_size  # [b]
        padding = torch.full_like(slots, PADDING_SLOT)
        self.slot_mapping[:bucket].copy_(torch.where(rows == PADDING_ROW, padding, slots))

    def _put(self, dst: torch.Tensor, values: list[int]) -> None:
        # NOTE: from pinned memory the copy returns at once and stays ordered before the
        # replay on this stream (a pageable source would wait for the stream to drain).
        dst.copy_(stage(values, dst.dtype, dst.device), non_blocking=True)

    def _check_bucket(self, bucket: int) -> None:
        if not 1 <= bucket <= self.max_batch:
            raise ValueError(f"bucket {bucket} outside 1..{self.max_batch}")
