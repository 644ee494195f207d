"""One tier's index: block hash -> slot, in least-recently-used order, with pins and idle ages.

Shared by the host and disk tiers (they differ in what a slot is: a row of a host buffer, a
file). An entry is **pinned** while a load reads it, so neither eviction nor a TTL can take it
from under the reader; eviction and expiry walk the LRU order and skip pinned entries.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from core.errors import KVCacheError
from core.hashing import BlockHash


@dataclass(slots=True)
class TierEntry:
    """Where one cached block sits in its tier and when it was last used."""

    slot: int
    last_used_s: float
    pins: int = 0


class TierEntries:
    """LRU-ordered entries of one tier, at most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise KVCacheError(f"a KV tier needs room for at least one block, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[BlockHash, TierEntry] = OrderedDict()  # LRU first

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._entries

    def get(self, block_hash: BlockHash) -> TierEntry | None:
        """The entry of ``block_hash`` (its LRU position unchanged)."""
        return self._entries.get(block_hash)

    def hashes(self) -> list[BlockHash]:
        """Every hash, least recently used first."""
        return list(self._entries)

    def items(self) -> list[tuple[BlockHash, TierEntry]]:
        """Every (hash, entry), least recently used first."""
        return list(self._entries.items())

    @property
    def full(self) -> bool:
        """True when adding an entry needs an eviction first."""
        return len(self._entries) >= self.capacity

    def add(self, block_hash: BlockHash, slot: int, now_s: float) -> None:
        """Insert a new entry as the most recently used."""
        if block_hash in self._entries:
            raise KVCacheError(f"block {block_hash:#x} is already in this tier")
        if self.full:
            raise KVCacheError(f"KV tier full ({self.capacity} blocks); evict first")
        self._entries[block_hash] = TierEntry(slot, now_s)

    def touch(self, block_hash: BlockHash, now_s: float) -> None:
        """Mark a use: most recently used, idle age reset."""
        entry = self._entries[block_hash]
        entry.last_used_s = now_s
        self._entries.move_to_end(block_hash)

    def pin(self, block_hash: BlockHash) -> TierEntry:
        """Protect an entry from eviction and expiry until :meth:`unpin`."""
        entry = self._entries[block_hash]
        entry.pins += 1
        return entry

    def unpin(self, block_hash: BlockHash) -> None:
        """Drop one pin taken by :meth:`pin`."""
        entry = self._entries[block_hash]
        if entry.pins <= 0:
            raise KVCacheError(f"block {block_hash:#x} unpinned more often than pinned")
        entry.pins -= 1

    def pop(self, block_hash: BlockHash) -> TierEntry:
        """Remove an unpinned entry."""
        entry = self._entries[block_hash]
        if entry.pins:
            raise KVCacheError(f"block {block_hash:#x} is pinned by a load; cannot remove it")
        return self._entries.pop(block_hash)

    def victim(self) -> BlockHash | None:
        """The least recently used unpinned hash, if any."""
        return next((h for h, e in self._entries.items() if not e.pins), None)

    def expired(self, cutoff_s: float) -> list[BlockHash]:
        """Unpinned hashes idle since before ``cutoff_s``, oldest first."""
        out: list[BlockHash] = []
        for block_hash, entry in self._entries.items():
            if entry.last_used_s >= cutoff_s:
                break  # LRU order is last-use order: the rest are younger
            if not entry.pins:
                out.append(block_hash)
        return out

    def check(self, num_slots: int, tier: str) -> set[int]:
        """The slots in use; raises unless each is distinct and in range."""
        slots = [entry.slot for entry in self._entries.values()]
        bad = [s for s in slots if not 0 <= s < num_slots]
        if bad or len(set(slots)) != len(slots) or len(slots) > self.capacity:
            raise KVCacheError(
                f"KV {tier} tier integrity: slots {sorted(slots)[:8]} out of range, repeated "
                f"or more than {self.capacity}"
            )
        return set(slots)
