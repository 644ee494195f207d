"""The cluster-wide KV index: which replica of which pool caches which block hash, in which tier.

Pure Python (no Ray): the index actor holds the authoritative copy, every router holds a
follower copy, and unit tests drive it directly. It is fed by the engines' KV events in their
compact form (``cluster.routing.kv_index.compaction``), so every entry reflects what a prefix
cache (or a host or disk tier under it) really holds.

Consistency: each replica's batches carry ``replica_seq`` 0, 1, 2, ...; a batch with the next
seq is applied, an older one is ignored (already covered by a snapshot), and a jump marks the
replica **degraded**: its entries are dropped (they can no longer be trusted), later batches are
ignored, and :meth:`KVIndex.needs_resync` says so until :meth:`KVIndex.resync` installs a
snapshot of the replica's whole cache. A replica is known only after its first resync (the
publisher's registration), so a restarted index asks every replica for a snapshot.

Matching follows the engine's lookup exactly: a replica's hit is its run of *leading* prompt
blocks on the device, continued by a run held in its host or disk tier (the engine loads those
back), stopping at the first block it holds in neither (:meth:`KVIndex.match_tiers` says how
many blocks come from each medium; a block in both host and disk counts as host, the cheaper).
The walk is O(len(hashes)) bit operations over every replica of the pool at once.

Sampled hashes (``stride`` > 1, ``routing.kv_index_stride``): replicas publish only the hashes
:func:`~cluster.routing.kv_index.compaction.is_sampled` keeps, and a lookup walks the prompt's
sampled hashes alone. A replica's hit then ends at the last sampled block of its run (the
blocks after it, up to the next sampled one, are not known to be cached and count as uncached),
so a hit is low by about ``stride`` blocks at most on average, while events, memory and the
walk shrink ``stride``-fold. A block evicted between two sampled ones is missed the other way
(the hit runs on to the next sampled block); the engine then recomputes it, as after any stale
hit.

Memory: each replica gets a slot; per pool and medium a dict maps hash -> its holders (one
replica's slot, or a bitmask only where a block is shared; see ``holders``) and each replica
keeps the set of its hashes for dropping its entries, so the index is bounded by the replicas'
KV capacities in every tier; a replica reporting more than ``max_blocks_per_replica`` entries is
degraded rather than allowed to grow it further.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cluster.routing.kv_index.compaction import (
    DEVICE_BIT,
    HOST_BIT,
    MEDIUM_BITS,
    OP_CLEARED,
    OP_REMOVED,
    OP_STORED,
    TierSnapshot,
    compact_events,
)
from cluster.routing.kv_index.holders import Holders, ReplicaEntries, TierHit
from core.hashing import BlockHash
from core.kv_events import KVEventBatch
from core.kv_index_messages import IndexOp

logger = logging.getLogger(__name__)

DEFAULT_MAX_BLOCKS_PER_REPLICA = 1 << 22


class ApplyStatus(enum.Enum):
    """What :meth:`KVIndex.apply_ops` did with a batch."""

    APPLIED = "applied"
    STALE = "stale"  # seq already covered (a snapshot or a duplicate); ignored
    GAP = "gap"  # seq jumped: the replica is now degraded and needs a resync
    NEEDS_RESYNC = "needs_resync"  # unknown or already degraded replica; ignored


@dataclass(frozen=True)
class IndexStats:
    """Size of the index, for metrics."""

    num_replicas: int
    num_degraded_replicas: int
    num_entries: int  # (replica, hash) pairs, any medium
    num_hashes: int  # distinct hashes over all pools


class KVIndex:
    """Per pool: block hash -> replicas holding it per medium; per replica: seq and health."""

    def __init__(
        self, *, max_blocks_per_replica: int = DEFAULT_MAX_BLOCKS_PER_REPLICA, stride: int = 1
    ) -> None:
        if stride < 1:
            raise ValueError(f"stride must be at least 1, got {stride}")
        self.max_blocks_per_replica = max_blocks_per_replica
        self.stride = stride
        self._replicas: dict[str, ReplicaEntries] = {}
        self._holders = Holders()
        self._slot_owner: dict[int, str] = {}
        self._free_slots: list[int] = []
        self._healthy: dict[str, int] = {}  # pool -> slot mask of its trusted replicas

    # -- updates --------------------------------------------------------------------------

    def apply(self, replica_id: str, batch: KVEventBatch) -> ApplyStatus:
        """Apply one engine event batch of ``replica_id`` (see the module docstring)."""
        ops = compact_events(batch.events, self.stride)
        return self.apply_ops(replica_id, batch.replica_seq, ops)

    def apply_ops(self, replica_id: str, replica_seq: int, ops: Sequence[IndexOp]) -> ApplyStatus:
        """Apply a compact batch; ordering and gap rules as in the module docstring."""
        replica = self._replicas.get(replica_id)
        if replica is None or replica.degraded:
            return ApplyStatus.NEEDS_RESYNC
        if replica_seq <= replica.last_seq:
            return ApplyStatus.STALE
        if replica_seq != replica.last_seq + 1:
            logger.warning(
                "KV events of replica %s jumped from seq %d to %d: degraded until resync",
                replica_id,
                replica.last_seq,
                replica_seq,
            )
            self._degrade(replica)
            return ApplyStatus.GAP
        replica.last_seq = replica_seq
        for op in ops:
            if op.kind == OP_STORED:
                self._holders.store(replica, op.hashes, MEDIUM_BITS[op.medium])
            elif op.kind == OP_REMOVED:
                self._holders.remove(replica, op.hashes, MEDIUM_BITS[op.medium])
            elif op.kind == OP_CLEARED:  # the device pool's reset: lower tiers keep theirs
                on_device = self._holders.hashes_of(replica, DEVICE_BIT)
                self._holders.remove(replica, on_device, DEVICE_BIT)
        if replica.num_entries > self.max_blocks_per_replica:
            logger.warning(
                "replica %s reports %d cached blocks (limit %d): degraded",
                replica_id,
                replica.num_entries,
                self.max_blocks_per_replica,
            )
            self._degrade(replica)
            return ApplyStatus.GAP
        return ApplyStatus.APPLIED

    def resync(
        self,
        replica_id: str,
        snapshot_hashes: Iterable[BlockHash],
        seq: int,
        *,
        pool: str | None = None,
        tiers: TierSnapshot | None = None,
    ) -> None:
        """Replace the replica's entries by a snapshot covering every batch before ``seq``
        (the next batch applied is ``seq``): ``snapshot_hashes`` on the device, ``tiers`` in
        its host and disk tiers. A new replica needs its ``pool``; a known one keeps its pool
        unless another is given (then it moves)."""
        replica = self._replicas.get(replica_id)
        if pool is None:
            if replica is None:
                raise ValueError(f"replica {replica_id!r} is unknown: resync needs its pool")
            pool = replica.pool
        if replica is not None and replica.pool != pool:
            self.remove_replica(replica_id)
            replica = None
        if replica is None:
            replica = ReplicaEntries(pool=pool, slot=self._take_slot(replica_id), last_seq=seq - 1)
            self._replicas[replica_id] = replica
        self._holders.clear(replica)
        replica.last_seq = seq - 1
        replica.degraded = False
        self._healthy.clear()
        self._holders.store(replica, snapshot_hashes, DEVICE_BIT)
        for medium, hashes in (tiers or {}).items():
            self._holders.store(replica, hashes, MEDIUM_BITS[medium])
        if replica.num_entries > self.max_blocks_per_replica:
            self._degrade(replica)

    def mark_degraded(self, replica_id: str) -> bool:
        """Stop trusting a replica's entries until its next resync; False when unknown."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return False
        self._degrade(replica)
        return True

    def remove_replica(self, replica_id: str) -> bool:
        """Forget a replica that died or drained; False when it was unknown."""
        replica = self._replicas.pop(replica_id, None)
        if replica is None:
            return False
        self._healthy.clear()
        self._holders.clear(replica)
        del self._slot_owner[replica.slot]
        self._free_slots.append(replica.slot)
        return True

    # -- queries --------------------------------------------------------------------------

    def match(self, pool: str, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        """``{replica_id: leading blocks usable}`` (any medium) for healthy replicas with a hit."""
        return {rid: hit.num_blocks for rid, hit in self.match_tiers(pool, block_hashes).items()}

    def match_tiers(self, pool: str, block_hashes: Sequence[BlockHash]) -> dict[str, TierHit]:
        """Per healthy replica of ``pool`` with a hit: its usable prefix split by medium."""
        if self.stride > 1:
            return self._match_sampled(pool, block_hashes)
        runs = self._holders.match(pool, block_hashes, self._healthy_mask(pool))
        result: dict[str, TierHit] = {}
        for slot, slot_runs in runs.items():
            replica_id = self._slot_owner[slot]
            replica = self._replicas[replica_id]
            result[replica_id] = self._holders.split_hit(replica, block_hashes, slot_runs)
        return result

    def _match_sampled(self, pool: str, block_hashes: Sequence[BlockHash]) -> dict[str, TierHit]:
        """:meth:`match_tiers` over the prompt's sampled blocks, widened back to blocks: the
        sampled block at prompt position ``p`` stands for the blocks after the previous
        sampled one up to ``p``, in its medium."""
        positions = [i for i, h in enumerate(block_hashes) if h % self.stride == 0]
        sampled = [block_hashes[i] for i in positions]
        runs = self._holders.match(pool, sampled, self._healthy_mask(pool))
        result: dict[str, TierHit] = {}
        for slot, (num_device, num_total) in runs.items():
            replica_id = self._slot_owner[slot]
            replica = self._replicas[replica_id]
            device_blocks = positions[num_device - 1] + 1 if num_device else 0
            host_blocks = disk_blocks = 0
            for k in range(num_device, num_total):
                span = positions[k] - (positions[k - 1] if k else -1)
                if self._holders.holds(replica, sampled[k], HOST_BIT):
                    host_blocks += span
                else:
                    disk_blocks += span
            result[replica_id] = TierHit(device_blocks, host_blocks, disk_blocks)
        return result

    def replica_ids(self, pool: str | None = None) -> list[str]:
        """Known replicas (of ``pool`` when given), in registration order."""
        return [rid for rid, r in self._replicas.items() if pool is None or r.pool == pool]

    def pool_of(self, replica_id: str) -> str | None:
        """The pool a replica registered in (``None`` when unknown)."""
        replica = self._replicas.get(replica_id)
        return None if replica is None else replica.pool

    def is_degraded(self, replica_id: str) -> bool:
        """True while the replica's entries are not trusted (a gap, awaiting resync)."""
        replica = self._replicas.get(replica_id)
        return replica is not None and replica.degraded

    def needs_resync(self, replica_id: str) -> bool:
        """True when the index wants a snapshot of this replica (unknown or degraded)."""
        replica = self._replicas.get(replica_id)
        return replica is None or replica.degraded

    def last_seq(self, replica_id: str) -> int | None:
        """The last applied ``replica_seq`` (-1 before any); ``None`` when unknown."""
        replica = self._replicas.get(replica_id)
        return None if replica is None else replica.last_seq

    def cached_hashes(self, replica_id: str, medium: str = "device") -> set[BlockHash]:
        """A copy of the hashes the index believes ``replica_id`` holds in ``medium``."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return set()
        return self._holders.hashes_of(replica, MEDIUM_BITS[medium])

    def stats(self) -> IndexStats:
        """Sizes for the metrics hooks (index size, degraded replicas)."""
        return IndexStats(
            num_replicas=len(self._replicas),
            num_degraded_replicas=sum(1 for r in self._replicas.values() if r.degraded),
            num_entries=sum(r.num_entries for r in self._replicas.values()),
            num_hashes=self._holders.num_hashes(),
        )

    # -- internals ------------------------------------------------------------------------

    def _healthy_mask(self, pool: str) -> int:
        """Slots of ``pool``'s trusted replicas (cached: replicas join, leave and degrade far
        less often than prompts are matched)."""
        mask = self._healthy.get(pool)
        if mask is None:
            mask = 0
            for replica in self._replicas.values():
                if replica.pool == pool and not replica.degraded:
                    mask |= 1 << replica.slot
            self._healthy[pool] = mask
        return mask

    def _take_slot(self, replica_id: str) -> int:
        slot = self._free_slots.pop() if self._free_slots else len(self._slot_owner)
        self._slot_owner[slot] = replica_id
        return slot

    def _degrade(self, replica: ReplicaEntries) -> None:
        self._holders.clear(replica)
        replica.degraded = True
        self._healthy.clear()
