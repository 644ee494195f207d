"""The device blocks the KV tiers copy from and into, one row of bytes per block.

One engine's rows are its KV tensor seen as ``[num_blocks, block_bytes]`` bytes: a block moves
down as a view of its row and comes back as one copy into it. Rank 0 of a tensor-parallel gang
holds the tiers for the whole gang (it alone decides what is cached where), so its rows are
every rank's KV side by side: a tier slot holds a block's bytes of rank 0, then rank 1, and so
on; a block moving down is gathered from every rank, and one coming back is split over them.
The other ranks' rows are their KV as rank 0 maps it (``LeaderRunner.rank_storages``), known
once the gang has formed, so they join with :meth:`DeviceRows.add_ranks`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.errors import ConfigError


class DeviceRows:
    """``[num_blocks, block_bytes]`` uint8 rows over one or several ranks' KV."""

    def __init__(self, first: torch.Tensor, num_ranks: int = 1) -> None:
        """``first``: this engine's rows; ``num_ranks``: how many ranks' rows there will be
        (all of one width)."""
        self._parts = [first]
        self.num_ranks = num_ranks
        self.num_blocks = int(first.shape[0])
        self.rank_bytes = int(first.shape[1])
        self.block_bytes = self.rank_bytes * num_ranks
        self.is_cuda = first.is_cuda
        self.device = first.device

    def add_ranks(self, rows: Sequence[torch.Tensor]) -> None:
        """The other ranks' rows, in rank order; :class:`ConfigError` unless they complete the
        gang with rows of the same shape on the same device (a GPU rank's KV is not reachable
        from rank 0: its tiers need the staging path, not built yet)."""
        for part in rows:
            if part.shape != self._parts[0].shape or part.device != self.device:
                raise ConfigError(
                    f"a tensor-parallel rank's KV rows {tuple(part.shape)} on {part.device} do "
                    f"not match rank 0's {tuple(self._parts[0].shape)} on {self.device}: KV "
                    "tiers under a gang need every rank's KV reachable from rank 0 (CPU only "
                    "for now)",
                    param="kv_tiers",
                )
        self._parts.extend(rows)
        if len(self._parts) != self.num_ranks:
            raise ConfigError(
                f"KV tiers expected {self.num_ranks} ranks' rows, got {len(self._parts)}",
                param="kv_tiers",
            )

    def read(self, block_id: int) -> torch.Tensor:
        """A block's bytes: a view of its row (one rank) or every rank's gathered (a copy)."""
        if len(self._parts) == 1:
            return self._parts[0][block_id]
        return torch.cat([part[block_id] for part in self._parts])

    def write(self, block_id: int, data: torch.Tensor, *, non_blocking: bool = False) -> None:
        """Copy a block's bytes (as :meth:`read` gives them) into its row(s)."""
        for rank, part in enumerate(self._parts):
            start = rank * self.rank_bytes
            part[block_id].copy_(data[start : start + self.rank_bytes], non_blocking=non_blocking)
