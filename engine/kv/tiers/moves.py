"""Moves down the hierarchy: device -> host -> disk -> gone, on eviction, write-through or TTL.

Runs on the engine thread; only the disk writes and deletes go to the I/O thread. A block
leaving a tier is recorded as ``BlockStored`` on the tier below (when admitted there) before the
``BlockRemoved`` on its own, so the cluster index never misses a copy that still exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from core.config import KVTiersConfig
from core.hashing import BlockHash
from core.kv_events import BlockRemoved, BlockStored, KVMedium
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.tiers.counters import ReuseCounts, TierCounters
from engine.kv.tiers.device_rows import DeviceRows
from engine.kv.tiers.disk import DiskTier
from engine.kv.tiers.host import HostTier
from engine.kv.tiers.io import TierIO


class TierMoves:
    """The down moves of one engine's tiers and their counters."""

    def __init__(
        self,
        config: KVTiersConfig,
        block_size: int,
        device_blocks: DeviceRows,
        host: HostTier | None,
        disk: DiskTier | None,
        io: TierIO,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.block_size = block_size
        self.block_bytes = device_blocks.block_bytes
        self.host = host
        self.disk = disk
        self.io = io
        self.clock = clock
        self._device_blocks = device_blocks
        capacity = sum(t.entries.capacity for t in self._tiers())
        self.uses = ReuseCounts(4 * (capacity + device_blocks.num_blocks))
        self.counters: dict[KVMedium, TierCounters] = {
            "device": TierCounters(),
            "host": TierCounters(),
            "disk": TierCounters(),
        }
        self.events = KVEventPublisher()

    def _tiers(self) -> list[HostTier | DiskTier]:
        return [t for t in (self.host, self.disk) if t is not None]

    # -- down: hooks called by the device pool (engine thread) --------------------------------

    def on_device_cached(self, block_id: int, block_hash: BlockHash) -> None:
        """A device block joined the prefix cache; written through to host if so configured."""
        self.uses.add(block_hash)
        if (
            self.host is not None
            and self.config.host
            and (self.config.host.write_policy == "write_through")
        ):
            self._to_host(block_hash, self._device_blocks.read(block_id))

    def on_device_hit(self, block_hashes: list[BlockHash]) -> None:
        """A request adopted these device-cached blocks."""
        self.counters["device"].hits += len(block_hashes)
        for block_hash in block_hashes:
            self.uses.add(block_hash)

    def on_device_evicted(self, block_id: int, block_hash: BlockHash) -> None:
        """The device pool is about to reuse (or expire) this cached block: copy it down."""
        source = self._device_blocks.read(block_id)
        if self.host is not None:
            self._to_host(block_hash, source)
        elif self.disk is not None:
            self._to_disk(block_hash, lambda: source.cpu().numpy().tobytes())

    def admit(self, block_hash: BlockHash, payload: torch.Tensor) -> bool:
        """A block that arrived from elsewhere (a deliberate copy of a hot prefix, pulled from
        another replica): into the host tier whatever its reuse count, as a device eviction
        would put it there, and published as stored on ``host``. True when the tier holds it
        now; False without a host tier, for a payload of another size, or when every slot is
        being read by a load."""
        host = self.host
        if host is None or payload.numel() != self.block_bytes:
            return False
        now_s = self.clock()
        if block_hash in host.entries:
            host.entries.touch(block_hash, now_s)
            return True
        if host.entries.full:
            victim = host.entries.victim()
            if victim is None:
                return False
            self._leave_host(victim, expired=False)
        host.store(block_hash, payload, now_s)
        self.stored([block_hash], "host")
        return True

    def _to_host(self, block_hash: BlockHash, source: torch.Tensor) -> None:
        host = self.host
        assert host is not None and self.config.host is not None
        if block_hash in host.entries:
            host.entries.touch(block_hash, self.clock())
            return
        if self.uses.get(block_hash) < self.config.host.min_reuse:
            return
        if host.entries.full:
            victim = host.entries.victim()
            if victim is None:
                return  # every slot is being read by a load
            self._leave_host(victim, expired=False)
        start = time.perf_counter()
        host.store(block_hash, source, self.clock())
        counters = self.counters["host"]
        counters.offload_bytes += self.block_bytes
        counters.offload_seconds += time.perf_counter() - start
        self.stored([block_hash], "host")

    def _leave_host(self, block_hash: BlockHash, *, expired: bool) -> None:
        host = self.host
        assert host is not None
        entry = host.entries.get(block_hash)
        assert entry is not None
        if self.disk is not None:
            row = host.row(entry)
            self._to_disk(block_hash, lambda: row.numpy().tobytes())
        host.drop(block_hash)
        self._count_leave("host", expired)
        self.events.record(BlockRemoved(block_hashes=[block_hash], medium="host"))

    def _to_disk(self, block_hash: BlockHash, payload: Callable[[], bytes]) -> None:
        disk = self.disk
        assert disk is not None and self.config.disk is not None
        if block_hash in disk.entries:
            disk.entries.touch(block_hash, self.clock())
            return
        if self.uses.get(block_hash) < self.config.disk.min_reuse:
            return
        if disk.entries.full:
            victim = disk.entries.victim()
            if victim is None:
                return
            self.leave_disk(victim, expired=False)
        data = payload()  # NOTE: copied now; the source slot may be reused right after
        disk.entries.add(block_hash, 0, self.clock())
        counters = self.counters["disk"]

        def write() -> None:
            start = time.perf_counter()
            disk.write(block_hash, data)
            counters.offload_seconds += time.perf_counter() - start
            counters.offload_bytes += len(data)

        self.io.disk(write)
        self.stored([block_hash], "disk")

    def leave_disk(self, block_hash: BlockHash, *, expired: bool) -> None:
        disk = self.disk
        assert disk is not None
        disk.entries.pop(block_hash)
        self.io.disk(lambda: disk.delete(block_hash))
        self._count_leave("disk", expired)
        self.events.record(BlockRemoved(block_hashes=[block_hash], medium="disk"))

    def _count_leave(self, medium: KVMedium, expired: bool) -> None:
        if expired:
            self.counters[medium].ttl_expiries += 1
        else:
            self.counters[medium].evictions += 1

    def stored(self, block_hashes: list[BlockHash], medium: KVMedium) -> None:
        self.events.record(
            BlockStored(
                block_hashes=list(block_hashes),
                parent_hash=None,
                token_ids=[],
                block_size=self.block_size,
                medium=medium,
            )
        )

    # -- TTLs ----------------------------------------------------------------------------------

    def expire(self) -> None:
        """Demote host blocks idle past ``host_ttl_s`` and delete disk blocks idle past
        ``disk_ttl_s`` (device blocks expire in the device pool)."""
        now = self.clock()
        if self.host is not None and self.config.host_ttl_s is not None:
            for block_hash in self.host.entries.expired(now - self.config.host_ttl_s):
                self._leave_host(block_hash, expired=True)
        if self.disk is not None and self.config.disk_ttl_s is not None:
            for block_hash in self.disk.entries.expired(now - self.config.disk_ttl_s):
                self.leave_disk(block_hash, expired=True)

    def count_device_expiry(self) -> None:
        """The device pool released one block for its idle age."""
        self.counters["device"].ttl_expiries += 1
