"""The scheduler's side of the KV tiers under its device pool: look up, load back, count.

The scheduler always holds one :class:`TierLoading`, so it never asks whether the engine has
tiers: :class:`KVTierLoading` drives the engine's :class:`~engine.kv.tiers.store.KVTiers` (and
hooks their down moves into the device pool), :class:`NoTierLoading` stands in when there are
none — nothing is ever found below the device, so nothing loads, and the only tier it reports
is the device. :func:`tier_loading` picks one. Tensor-free: ``KVTiers`` and its loads (torch)
are named for type checking only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from core.hashing import BlockHash
from core.stats import KVTierStats
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.kv_cache_manager import KVCacheManager
from engine.kv.tiers.counters import TierCounters

if TYPE_CHECKING:
    from engine.kv.tiers.loads import FinishedLoad
    from engine.kv.tiers.store import KVTiers


class TierLoading(Protocol):
    """What the scheduler asks of the tiers below its device pool (engine thread only)."""

    def find(self, block_hashes: list[BlockHash]) -> int:
        """How many of ``block_hashes`` (a continuation of a device hit), from the first, sit in
        a lower tier."""
        ...

    def start_load(
        self, request_id: str, block_hashes: list[BlockHash], dst_block_ids: list[int]
    ) -> None:
        """Copy these lower-tier blocks (as found by :meth:`find`) into these freshly allocated
        device blocks; :meth:`poll` hands the load back once the copy has ended."""
        ...

    def poll(self) -> list[FinishedLoad]:
        """The loads that finished since the last call."""
        ...

    def wait(self, timeout_s: float) -> None:
        """Block until some load finishes or ``timeout_s`` passes (nothing else to step)."""
        ...

    def expire(self, num_device_expired: int) -> None:
        """Count the device blocks the pool just released for their idle age, then apply the
        lower tiers' own idle TTLs."""
        ...

    def on_device_hit(self, block_hashes: list[BlockHash]) -> None:
        """A request adopted these device-cached blocks (counted as device hits and uses)."""
        ...

    def stats(self, device_used: int, device_capacity: int) -> tuple[KVTierStats, ...]:
        """Every tier, device first (its occupancy given here): occupancy and counters."""
        ...

    def check_integrity(self) -> None:
        """Raise ``KVCacheError`` unless the tiers' slots and pins agree with the loads."""
        ...

    def close(self) -> None:
        """Stop the tiers' I/O after pending writes and the loads in flight."""
        ...


class KVTierLoading:
    """:class:`TierLoading` over the engine's host and/or disk tiers."""

    def __init__(self, tiers: KVTiers, kv: KVCacheManager, events: KVEventPublisher) -> None:
        self.tiers = tiers
        tiers.attach(events)
        kv.pool.register_evict_listener(tiers.moves.on_device_evicted)
        kv.register_cached_listener(tiers.moves.on_device_cached)

    def find(self, block_hashes: list[BlockHash]) -> int:
        """See :meth:`TierLoading.find`."""
        return self.tiers.find(block_hashes)

    def start_load(
        self, request_id: str, block_hashes: list[BlockHash], dst_block_ids: list[int]
    ) -> None:
        """See :meth:`TierLoading.start_load`."""
        self.tiers.start_load(request_id, block_hashes, dst_block_ids)

    def poll(self) -> list[FinishedLoad]:
        """See :meth:`TierLoading.poll`."""
        return self.tiers.poll()

    def wait(self, timeout_s: float) -> None:
        """See :meth:`TierLoading.wait`."""
        self.tiers.wait(timeout_s)

    def expire(self, num_device_expired: int) -> None:
        """See :meth:`TierLoading.expire`."""
        for _ in range(num_device_expired):
            self.tiers.moves.count_device_expiry()
        self.tiers.moves.expire()

    def on_device_hit(self, block_hashes: list[BlockHash]) -> None:
        """See :meth:`TierLoading.on_device_hit`."""
        self.tiers.moves.on_device_hit(block_hashes)

    def stats(self, device_used: int, device_capacity: int) -> tuple[KVTierStats, ...]:
        """See :meth:`TierLoading.stats`."""
        device = self.tiers.counters["device"].stats("device", device_used, device_capacity)
        return (device, *self.tiers.stats())

    def check_integrity(self) -> None:
        """See :meth:`TierLoading.check_integrity`."""
        self.tiers.check_integrity()

    def close(self) -> None:
        """See :meth:`TierLoading.close`."""
        self.tiers.close()


class NoTierLoading:
    """:class:`TierLoading` of an engine without lower tiers: no hits, no loads, no counts."""

    def find(self, block_hashes: list[BlockHash]) -> int:
        """Nothing sits below the device."""
        return 0

    def start_load(
        self, request_id: str, block_hashes: list[BlockHash], dst_block_ids: list[int]
    ) -> None:
        """Never called with blocks: :meth:`find` finds none."""

    def poll(self) -> list[FinishedLoad]:
        """No load is ever in flight."""
        return []

    def wait(self, timeout_s: float) -> None:
        """No load to wait for: returns at once."""

    def expire(self, num_device_expired: int) -> None:
        """No counters and no lower tiers to expire."""

    def on_device_hit(self, block_hashes: list[BlockHash]) -> None:
        """No counters."""

    def stats(self, device_used: int, device_capacity: int) -> tuple[KVTierStats, ...]:
        """The device row alone, its counters at zero."""
        return (TierCounters().stats("device", device_used, device_capacity),)

    def check_integrity(self) -> None:
        """Nothing to check."""

    def close(self) -> None:
        """Nothing to stop."""


def tier_loading(
    tiers: KVTiers | None, kv: KVCacheManager, events: KVEventPublisher
) -> TierLoading:
    """The scheduler's tier loading: over ``tiers`` (hooked into ``kv``'s device pool, moves
    recorded through ``events``), or the do-nothing one when the engine has no lower tiers."""
    return NoTierLoading() if tiers is None else KVTierLoading(tiers, kv, events)
