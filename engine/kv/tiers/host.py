"""The host-RAM tier: whole KV blocks in one preallocated host buffer (pinned on CUDA).

A slot is one row of ``buffer[num_slots, block_bytes]`` holding a block exactly as the device
pool lays it out (``core.kv_layout``), so moving a block either way is one contiguous copy.
Copies down from a CUDA device are asynchronous on the device's current stream (the next step's
writes to that device block queue behind them); each slot remembers the copy's CUDA event and a
reader waits for it. On the CPU every copy completes at once.
"""

from __future__ import annotations

import torch

from core.errors import KVCacheError
from core.hashing import BlockHash
from core.kv_events import KVMedium
from engine.kv.tiers.entries import TierEntries, TierEntry


class HostTier:
    """``num_slots`` host block slots, indexed by block hash."""

    medium: KVMedium = "host"

    def __init__(self, block_bytes: int, num_slots: int, *, pin_memory: bool) -> None:
        self.block_bytes = block_bytes
        self.num_slots = num_slots
        self.buffer = torch.zeros(
            (num_slots, block_bytes), dtype=torch.uint8, pin_memory=pin_memory
        )
        self.entries = TierEntries(num_slots)
        self._free_slots = list(range(num_slots - 1, -1, -1))
        self._copies: dict[int, torch.cuda.Event] = {}  # slot -> copy down still in flight

    @property
    def capacity_bytes(self) -> int:
        """Bytes this tier holds when full."""
        return self.num_slots * self.block_bytes

    def store(self, block_hash: BlockHash, source: torch.Tensor, now_s: float) -> None:
        """Copy one device block (a uint8 view of ``block_bytes``) into a free slot."""
        if not self._free_slots:
            raise KVCacheError("host KV tier has no free slot; evict first")
        slot = self._free_slots.pop()
        self.entries.add(block_hash, slot, now_s)
        row = self.buffer[slot]
        if source.is_cuda:
            row.copy_(source, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._copies[slot] = event
        else:
            row.copy_(source)

    def row(self, entry: TierEntry) -> torch.Tensor:
        """The slot's bytes once any copy into it has finished (call from any thread)."""
        event = self._copies.get(entry.slot)
        if event is not None:
            event.synchronize()
        return self.buffer[entry.slot]

    def drop(self, block_hash: BlockHash) -> TierEntry:
        """Forget an unpinned block and free its slot."""
        entry = self.entries.pop(block_hash)
        self._copies.pop(entry.slot, None)
        self._free_slots.append(entry.slot)
        return entry

    def check_integrity(self) -> None:
        """Raise unless every slot is either free or held by exactly one entry."""
        used = self.entries.check(self.num_slots, "host")
        free = set(self._free_slots)
        if (
            used & free
            or len(used) + len(free) != self.num_slots
            or len(free) != len(self._free_slots)
        ):
            raise KVCacheError(
                f"KV host tier integrity: {len(used)} used + {len(self._free_slots)} free slots "
                f"!= {self.num_slots}"
            )
