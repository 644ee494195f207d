"""How one pull is cut into concurrent streams.

One gRPC stream moves ~1-2 GB/s here (the checksum, the copy out of the message and the
protocol's own work take turns on one thread); a pull over several streams at once lets those
overlap. :class:`StreamPlan` splits a pull's wanted blocks into contiguous runs of at least
``min_stream_bytes``, at most ``max_streams`` of them, so a small pull stays one stream (the v1
protocol, no extra round trip) and a large one spreads over the host's cores. A pipelined pull
takes blocks in segments of at least that size as the prefill completes them.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from core.config import TransferConfig

_MAX_AUTO_STREAMS = 8


@dataclass(frozen=True)
class StreamPlan:
    """How many streams a pull of so many blocks uses, and where each starts and ends."""

    max_streams: int
    min_stream_bytes: int

    @classmethod
    def from_config(cls, config: TransferConfig) -> StreamPlan:
        """``transfer.num_streams`` (None: half this host's cores, 1 to 8) and its minimum size."""
        streams = config.num_streams or min((os.cpu_count() or 1) // 2, _MAX_AUTO_STREAMS)
        return cls(max(1, streams), config.min_stream_bytes)

    def split(self, num_blocks: int, block_bytes: int) -> list[tuple[int, int]]:
        """``(start, end)`` of each stream's run of ``num_blocks`` blocks, in order."""
        if num_blocks <= 0:
            return []
        by_size = max(1, (num_blocks * block_bytes) // self.min_stream_bytes)
        count = min(self.max_streams, by_size, num_blocks)
        bounds = [num_blocks * i // count for i in range(count + 1)]
        return list(itertools.pairwise(bounds))

    def min_segment_blocks(self, block_bytes: int) -> int:
        """The fewest ready blocks a pipelined pull opens streams for (until the export ends)."""
        return max(1, self.min_stream_bytes // max(block_bytes, 1))
