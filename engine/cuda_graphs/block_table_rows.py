"""Every decoding request's block table as one row of a persistent device tensor.

From one decode step to the next the block tables barely change: a request gains a block every
``block_size`` tokens, a request joins, one leaves. :class:`BlockTableRows` keeps a row per
request in a device tensor ``[max_rows + 1, width]`` and, each step, writes only what changed —
a new request's row, the new tail of a row, or a whole row whose table changed in place (a
sliding window released its leading blocks, a preempted request came back with new blocks) —
with one upload of (row, column, block id) triples; the step's block tables are then gathered
from it on the device (:meth:`DecodeBuffers.derive`). Row :data:`PADDING_ROW` holds only the
padding block: the padding rows of a bucket point at it.

Rows are freed by :meth:`release` when requests end or are preempted; should that be missed,
running out of rows evicts the rows of every request not in the current step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from engine.cuda_graphs.buckets import PADDING_BLOCK, PADDING_ROW
from engine.device_io import upload


class BlockTableRows:
    """Up to ``max_rows`` requests' block tables of up to ``width`` blocks, on ``device``."""

    def __init__(self, max_rows: int, width: int, device: torch.device) -> None:
        if max_rows < 1 or width < 1:
            raise ValueError(f"need max_rows >= 1 and width >= 1, got {max_rows} and {width}")
        self.width = width
        self.device = device
        self.table = torch.full(  # [max_rows + 1, width], row 0 the padding row
            (max_rows + 1, width), PADDING_BLOCK, dtype=torch.int32, device=device
        )
        self._rows: dict[str, int] = {}
        self._known: dict[str, list[int]] = {}  # each row's content as last written
        self._free = list(range(max_rows, PADDING_ROW, -1))
        self.num_written_entries = 0
        """Block ids written so far (incremental updates keep this near one per block)."""

    def rows(self, tables: Sequence[tuple[str, Sequence[int]]]) -> list[int]:
        """The row of each ``(request_id, block_ids)``, after writing what changed since the
        last call (queued on the current stream, before the kernels that read the table)."""
        in_step = {request_id for request_id, _ in tables}
        row_ids: list[int] = []
        cols: list[int] = []
        values: list[int] = []
        result: list[int] = []
        for request_id, block_ids in tables:
            if len(block_ids) > self.width:
                raise ValueError(
                    f"request {request_id}: {len(block_ids)} blocks exceed the table width "
                    f"{self.width}"
                )
            row = self._rows.get(request_id)
            start = 0
            if row is None:
                row = self._take_row(in_step)
                self._rows[request_id] = row
            else:
                known = self._known[request_id]
                if len(block_ids) >= len(known) and block_ids[: len(known)] == known:
                    start = len(known)  # only the new tail
            new = block_ids[start:]
            row_ids.extend([row] * len(new))
            cols.extend(range(start, len(block_ids)))
            values.extend(new)
            self._known[request_id] = list(block_ids)
            result.append(row)
        if values:
            index = (
                upload(row_ids, torch.long, self.device),
                upload(cols, torch.long, self.device),
            )
            self.table.index_put_(index, upload(values, torch.int32, self.device))
            self.num_written_entries += len(values)
        return result

    def release(self, request_ids: Iterable[str]) -> None:
        """Free the rows of requests that ended or were preempted (unknown ids are ignored)."""
        for request_id in request_ids:
            row = self._rows.pop(request_id, None)
            if row is not None:
                del self._known[request_id]
                self._free.append(row)

    @property
    def num_free_rows(self) -> int:
        """Rows not held by any request."""
        return len(self._free)

    def _take_row(self, in_step: set[str]) -> int:
        if not self._free:  # releases were missed: keep only the rows this step uses
            self.release([rid for rid in self._rows if rid not in in_step])
        if not self._free:
            raise ValueError(f"more than {len(self._rows)} requests in one decode step")
        return self._free.pop()
