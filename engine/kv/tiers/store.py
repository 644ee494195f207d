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
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from core.config import KVTiersConfig
from core.hashing import BlockHash
from core.kv_events import BlockRemoved, BlockStored, KVMedium
from core.kv_layout import KVLayout
from core.stats import KVTierStats
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.tiers.counters import ReuseCounts, TierCounters
from engine.kv.tiers.disk import DiskTier
from engine.kv.tiers.host import HostTier
from engine.kv.tiers.io import LoadPart, LoadResult, TierIO

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass
class _Load:
    parts: list[LoadPart]
    future: Future[LoadResult]


@dataclass(frozen=True)
class FinishedLoad:
    """A load the engine thread can act on: its first ``num_loaded`` blocks are in place."""

    request_id: str
    num_loaded: int
    num_requested: int


class KVTiers:
    """Host and/or disk tiers of one engine, with the moves between them and the device."""

    def __init__(
        self,
        config: KVTiersConfig,
        layout: KVLayout,
        device_blocks: torch.Tensor,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self.block_size = layout.block_size
        self.block_bytes = layout.block_bytes
        self.clock = clock
        self._device_blocks = device_blocks  # [num_blocks, block_bytes] uint8 view
        now = clock()
        self.host = (
            HostTier(
                layout.block_bytes,
                config.host.bytes // layout.block_bytes,
                pin_memory=device_blocks.is_cuda,
            )
            if config.host is not None
            else None
        )
        self.disk = (
            DiskTier.open(
                config.disk.path, layout.fingerprint(), layout.block_bytes, config.disk.bytes, now
            )
            if config.disk is not None
            else None
        )
        capacity = sum(t.entries.capacity for t in self._tiers())
        self.uses = ReuseCounts(4 * (capacity + device_blocks.shape[0]))
        self.counters: dict[KVMedium, TierCounters] = {
            "device": TierCounters(),
            "host": TierCounters(),
            "disk": TierCounters(),
        }
        self.io = TierIO(device_blocks)
        self._loads: dict[str, _Load] = {}
        self._events = KVEventPublisher()

    def attach(self, publisher: KVEventPublisher) -> None:
        """Record tier moves through the scheduler's publisher; publishes a re-indexed disk."""
        self._events = publisher
        if self.disk is not None and len(self.disk.entries):
            self._stored(self.disk.entries.hashes(), "disk")

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
            self._to_host(block_hash, self._device_blocks[block_id])

    def on_device_hit(self, block_hashes: list[BlockHash]) -> None:
        """A request adopted these device-cached blocks."""
        self.counters["device"].hits += len(block_hashes)
        for block_hash in block_hashes:
            self.uses.add(block_hash)

    def on_device_evicted(self, block_id: int, block_hash: BlockHash) -> None:
        """The device pool is about to reuse (or expire) this cached block: copy it down."""
        source = self._device_blocks[block_id]
        if self.host is not None:
            self._to_host(block_hash, source)
        elif self.disk is not None:
            self._to_disk(block_hash, lambda: source.cpu().numpy().tobytes())

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
        self._stored([block_hash], "host")

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
        self._events.record(BlockRemoved(block_hashes=[block_hash], medium="host"))

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
            self._leave_disk(victim, expired=False)
        data = payload()  # NOTE: copied now; the source slot may be reused right after
        disk.entries.add(block_hash, 0, self.clock())
        counters = self.counters["disk"]

        def write() -> None:
            start = time.perf_counter()
            disk.write(block_hash, data)
            counters.offload_seconds += time.perf_counter() - start
            counters.offload_bytes += len(data)

        self.io.disk(write)
        self._stored([block_hash], "disk")

    def _leave_disk(self, block_hash: BlockHash, *, expired: bool) -> None:
        disk = self.disk
        assert disk is not None
        disk.entries.pop(block_hash)
        self.io.disk(lambda: disk.delete(block_hash))
        self._count_leave("disk", expired)
        self._events.record(BlockRemoved(block_hashes=[block_hash], medium="disk"))

    def _count_leave(self, medium: KVMedium, expired: bool) -> None:
        if expired:
            self.counters[medium].ttl_expiries += 1
        else:
            self.counters[medium].evictions += 1

    def _stored(self, block_hashes: list[BlockHash], medium: KVMedium) -> None:
        self._events.record(
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
                self._leave_disk(block_hash, expired=True)

    def count_device_expiry(self) -> None:
        """The device pool released one block for its idle age."""
        self.counters["device"].ttl_expiries += 1

    def touch_session(self, block_hashes: list[BlockHash]) -> None:
        """Refresh the idle age of a session's blocks wherever they sit below the device."""
        now = self.clock()
        for tier in self._tiers():
            for block_hash in block_hashes:
                if block_hash in tier.entries:
                    tier.entries.touch(block_hash, now)

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
        self._loads[request_id] = _Load(parts, self.io.load(parts))

    def _part(self, block_hash: BlockHash, dst_block_id: int) -> LoadPart:
        self.uses.add(block_hash)
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
        finished: list[FinishedLoad] = []
        for request_id, load in list(self._loads.items()):
            if not load.future.done():
                continue
            del self._loads[request_id]
            finished.append(self._settle(request_id, load))
        return finished

    def wait(self, timeout_s: float) -> None:
        """Block until some load finishes or ``timeout_s`` passes (nothing else to step)."""
        futures = [load.future for load in self._loads.values()]
        if futures:
            from concurrent.futures import FIRST_COMPLETED, wait

            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def _settle(self, request_id: str, load: _Load) -> FinishedLoad:
        try:
            result = load.future.result()
        except Exception as e:  # a copy failed outright: nothing loaded counts
            logger.exception("KV tier load for %s failed", request_id)
            result = LoadResult(0, 0.0, repr(e))
        now = self.clock()
        per_block_s = result.seconds / max(result.num_loaded, 1)
        for index, part in enumerate(load.parts):
            tier = self.host if part.medium == "host" else self.disk
            assert tier is not None
            tier.entries.unpin(part.block_hash)
            if index < result.num_loaded:
                tier.entries.touch(part.block_hash, now)
                counters = self.counters[part.medium]  # type: ignore[index]
                counters.hits += 1
                counters.onload_bytes += self.block_bytes
                counters.onload_seconds += per_block_s
            elif index == result.num_loaded and part.medium == "disk" and result.failure:
                self._leave_disk(part.block_hash, expired=False)  # unusable file: a miss
        return FinishedLoad(request_id, result.num_loaded, len(load.parts))

    # -- inspection -----------------------------------------------------------------------------

    def stats(self) -> tuple[KVTierStats, ...]:
        """Host and disk tiers' occupancy and counters (the device row is the scheduler's)."""
        return tuple(
            self.counters[tier.medium].stats(  # type: ignore[index]
                tier.medium, len(tier.entries), tier.entries.capacity
            )
            for tier in self._tiers()
        )

    def check_integrity(self) -> None:
        """Raise ``KVCacheError`` unless every tier's slots and pins agree with the loads."""
        if self.host is not None:
            self.host.check_integrity()
        pinned = {p.block_hash for load in self._loads.values() for p in load.parts}
        for tier in self._tiers():
            for block_hash, entry in tier.entries.items():
                if entry.pins and block_hash not in pinned:
                    from core.errors import KVCacheError

                    raise KVCacheError(
                        f"KV {tier.medium} tier integrity: block {block_hash:#x} is pinned by "
                        "no load"
                    )

    def close(self) -> None:
        """Finish pending disk writes, stop the I/O threads, release the disk directory."""
        self.io.shutdown()
        if self.disk is not None:
            self.disk.close()
