"""The KV tiers under one device pool: where blocks go when the pool lets them go, and back.

* **Down.** A cached block the device pool evicts (or one it caches, under ``write_through``)
  is copied to the host tier; a host block evicted (or idle past ``host_ttl_s``) is written to
  disk; a disk block evicted or idle past ``disk_ttl_s`` is deleted. With no host tier, device
  evictions go straight to disk. A tier admits a block only once it was used ``min_reuse``
  times (:class:`~engine.kv.tiers.counters.ReuseCounts`).
* **Back.** :meth:`KVTiers.find` extends a device prefix hit through host and disk;
  :meth:`KVTiers.start_load` pins the entries and copies them into device blocks on the I/O
  threads; :meth:`KVTiers.poll` (engine thread) hands back finished loads. A block that fails
  its checks ends the load there: what came before is used, the rest is recomputed.
* **Index.** Every move is a ``BlockStored`` / ``BlockRemoved`` event on its medium through the
  scheduler's publisher, so the cluster index knows every tier.

All bookkeeping runs on the engine thread; only the copies and file operations run elsewhere.
Lower tiers are inclusive: a block brought back stays in its tier, so evicting it again later
costs no copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from core.config import KVTiersConfig
from core.errors import KVCacheError
from core.hashing import BlockHash
from core.kv_layout import KVLayout
from core.stats import KVTierStats
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.tiers.device_rows import DeviceRows
from engine.kv.tiers.disk import DiskTier
from engine.kv.tiers.host import HostTier
from engine.kv.tiers.io import LoadPart, LoadResult, TierIO
from engine.kv.tiers.loads import FinishedLoad, Load, LoadTracker
from engine.kv.tiers.moves import TierMoves

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class KVTiers:
    """Host and/or disk tiers of one engine, with the moves between them and the device."""

    def __init__(
        self,
        config: KVTiersConfig,
        layout: KVLayout,
        device_blocks: DeviceRows,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        """``device_blocks``: this engine's KV rows (on rank 0 of a tensor-parallel gang, every
        rank's, so a tier slot holds a block of the whole gang)."""
        self.config = config
        self.block_size = layout.block_size
        self.block_bytes = device_blocks.block_bytes
        self.clock = clock
        self.device_blocks = device_blocks
        now = clock()
        self.host = (
            HostTier(
                self.block_bytes,
                config.host.bytes // self.block_bytes,
                pin_memory=device_blocks.is_cuda,
            )
            if config.host is not None
            else None
        )
        # a gang's blocks are every rank's bytes in rank order: only the same gang reads them
        gang = replace(layout, tp_rank=0)
        self.disk = (
            DiskTier.open(
                config.disk.path, gang.fingerprint(), self.block_bytes, config.disk.bytes, now
            )
            if config.disk is not None
            else None
        )
        self.io = TierIO(device_blocks)
        self.moves = TierMoves(
            config, self.block_size, device_blocks, self.host, self.disk, self.io, clock
        )
        """The down moves; the device pool's hooks (``on_device_*``) and the TTLs live there."""
        self.counters = self.moves.counters
        self._loads = LoadTracker()

    def attach(self, publisher: KVEventPublisher) -> None:
        """Record tier moves through the scheduler's publisher; publishes a re-indexed disk."""
        self.moves.events = publisher
        if self.disk is not None and len(self.disk.entries):
            self.moves.stored(self.disk.entries.hashes(), "disk")

    def _tiers(self) -> list[HostTier | DiskTier]:
        return [t for t in (self.host, self.disk) if t is not None]

    def admit(self, block_hashes: list[BlockHash], payloads: list[torch.Tensor]) -> int:
        """Blocks of a prefix pulled from another replica (``uint8`` rows of ``block_bytes``,
        leading block first) into the host tier, ahead of the requests that will onload them
        as any host hit (engine thread). Stops at the first block it cannot hold, so what it
        holds is a leading run; returns how many."""
        num_admitted = 0
        for block_hash, payload in zip(block_hashes, payloads, strict=True):
            if not self.moves.admit(block_hash, payload):
                break
            num_admitted += 1
        return num_admitted

    # -- back: lookups and loads ---------------------------------------------------------------

    def find(self, block_hashes: list[BlockHash]) -> int:
        """How many of ``block_hashes`` (a continuation of a device hit), from the first, sit in
        a lower tier."""
        count = 0
        for block_hash in block_hashes:
            if not any(block_hash in tier.entries for tier in self._tiers()):
                break
            count += 1
        return count

    def start_load(
        self, request_id: str, block_hashes: list[BlockHash], dst_block_ids: list[int]
    ) -> None:
        """Copy these lower-tier blocks into these (freshly allocated) device blocks."""
        parts = [self._part(h, dst) for h, dst in zip(block_hashes, dst_block_ids, strict=True)]
        self._loads.add(Load(request_id, parts, self.io.load(parts)))

    def _part(self, block_hash: BlockHash, dst_block_id: int) -> LoadPart:
        self.moves.uses.add(block_hash)
        host, disk = self.host, self.disk
        if host is not None and block_hash in host.entries:
            entry = host.entries.pin(block_hash)
            return LoadPart(block_hash, "host", dst_block_id, lambda: host.row(entry))
        assert disk is not None
        disk.entries.pin(block_hash)
        return LoadPart(
            block_hash,
            "disk",
            dst_block_id,
            lambda: torch.frombuffer(bytearray(disk.read(block_hash)), dtype=torch.uint8),
        )

    @property
    def num_loading(self) -> int:
        """Loads started and not yet handed back by :meth:`poll`."""
        return len(self._loads)

    def poll(self) -> list[FinishedLoad]:
        """Loads that finished since the last call; their entries are unpinned and counted."""
        return [self._settle(load) for load in self._loads.take_done()]

    def wait(self, timeout_s: float) -> None:
        """Block until some load finishes or ``timeout_s`` passes (nothing else to step)."""
        self._loads.wait_any(timeout_s)

    def _settle(self, load: Load) -> FinishedLoad:
        try:
            result = load.future.result()
        except Exception as e:  # a copy failed outright: nothing loaded counts
            logger.exception("KV tier load for %s failed", load.request_id)
            result = LoadResult(0, 0.0, repr(e))
        now = self.clock()
        per_block_s = result.seconds / max(result.num_loaded, 1)
        for index, part in enumerate(load.parts):
            tier = self.host if part.medium == "host" else self.disk
            assert tier is not None
            tier.entries.unpin(part.block_hash)
            if index < result.num_loaded:
                tier.entries.touch(part.block_hash, now)
                counters = self.counters[part.medium]
                counters.hits += 1
                counters.onload_bytes += self.block_bytes
                counters.onload_seconds += per_block_s
                counters.onload_blocks += 1
            elif index == result.num_loaded and part.medium == "disk" and result.failure:
                self.moves.leave_disk(part.block_hash, expired=False)  # unusable file: a miss
        return FinishedLoad(load.request_id, result.num_loaded, len(load.parts))

    # -- inspection -----------------------------------------------------------------------------

    def stats(self) -> tuple[KVTierStats, ...]:
        """Host and disk tiers' occupancy and counters (the device row is the scheduler's)."""
        return tuple(
            self.counters[tier.medium].stats(tier.medium, len(tier.entries), tier.entries.capacity)
            for tier in self._tiers()
        )

    def check_integrity(self) -> None:
        """Raise ``KVCacheError`` unless every tier's slots and pins agree with the loads."""
        if self.host is not None:
            self.host.check_integrity()
        pinned = self._loads.pinned_hashes()
        for tier in self._tiers():
            for block_hash, entry in tier.entries.items():
                if entry.pins and block_hash not in pinned:
                    raise KVCacheError(
                        f"KV {tier.medium} tier integrity: block {block_hash:#x} is pinned by "
                        "no load"
                    )

    def close(self) -> None:
        """Finish pending disk writes, stop the I/O threads, release the disk directory."""
        self.io.shutdown()
        if self.disk is not None:
            self.disk.close()
