"""Per-tier counters and the reuse counts behind the tiers' admission gates."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from core.hashing import BlockHash
from core.stats import KVTierStats


@dataclass
class TierCounters:
    """Monotonic counters of one tier (see :class:`core.stats.KVTierStats`)."""

    hits: int = 0
    offload_bytes: int = 0
    offload_seconds: float = 0.0
    onload_bytes: int = 0
    onload_seconds: float = 0.0
    onload_blocks: int = 0
    ttl_expiries: int = 0
    evictions: int = 0

    def stats(self, medium: str, used: int, capacity: int) -> KVTierStats:
        """The counters with the tier's occupancy now."""
        return KVTierStats(
            medium=medium,
            blocks_used=used,
            blocks_capacity=capacity,
            hits_total=self.hits,
            offload_bytes_total=self.offload_bytes,
            offload_seconds_total=self.offload_seconds,
            onload_bytes_total=self.onload_bytes,
            onload_seconds_total=self.onload_seconds,
            onload_blocks_total=self.onload_blocks,
            ttl_expiries_total=self.ttl_expiries,
            evictions_total=self.evictions,
        )


class ReuseCounts:
    """How often each recent block hash was used (computed or hit), for ``min_reuse`` gates.

    Bounded: the ``capacity`` most recently used hashes are remembered, so the counts of blocks
    long gone from every tier fall out instead of growing without end.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._counts: OrderedDict[BlockHash, int] = OrderedDict()

    def add(self, block_hash: BlockHash) -> None:
        """Count one use."""
        self._counts[block_hash] = self._counts.get(block_hash, 0) + 1
        self._counts.move_to_end(block_hash)
        if len(self._counts) > self.capacity:
            self._counts.popitem(last=False)

    def get(self, block_hash: BlockHash) -> int:
        """Uses counted so far (0 for a hash never seen or forgotten)."""
        return self._counts.get(block_hash, 0)
