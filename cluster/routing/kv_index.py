"""The cluster-wide KV index: which replica of which pool caches which block hash.

Pure Python (no Ray): the index actor holds the authoritative copy, every router holds a
follower copy, and unit tests drive it directly. It is fed by the engines' KV events
(``core.kv_events``) in their compact form (:func:`compact_events` drops token ids), so every
entry reflects what a prefix cache really holds.

Consistency: each replica's batches carry ``replica_seq`` 0, 1, 2, ...; a batch with the next
seq is applied, an older one is ignored (already covered by a snapshot), and a jump marks the
replica **degraded**: its entries are dropped (they can no longer be trusted), later batches are
ignored, and :meth:`KVIndex.needs_resync` says so until :meth:`KVIndex.resync` installs a
snapshot of the replica's whole cache. A replica is known only after its first resync (the
publisher's registration), so a restarted index asks every replica for a snapshot.

Matching follows the engine's prefix cache exactly: a replica's hit is the number of *leading*
prompt blocks it caches, stopping at its first miss (``match`` is O(len(hashes)) bit operations).

Memory: each replica gets a bit slot; per pool a dict maps hash -> bitmask of holders (~100 B
per distinct hash) and each replica keeps its own hash set (~60 B per entry), so the index is
bounded by the replicas' KV capacities; a replica reporting more than ``max_blocks_per_replica``
entries is degraded rather than allowed to grow it further.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from core.hashing import BlockHash
from core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch

logger = logging.getLogger(__name__)

OP_STORED, OP_REMOVED, OP_CLEARED = "stored", "removed", "cleared"
IndexOp = tuple[str, list[BlockHash]]
"""One compact event: ``(kind, block_hashes)``; ``cleared`` carries an empty list."""

DEFAULT_MAX_BLOCKS_PER_REPLICA = 1 << 22


class ApplyStatus(enum.Enum):
    """What :meth:`KVIndex.apply_ops` did with a batch."""

    APPLIED = "applied"
    STALE = "stale"  # seq already covered (a snapshot or a duplicate); ignored
    GAP = "gap"  # seq jumped: the replica is now degraded and needs a resync
    NEEDS_RESYNC = "needs_resync"  # unknown or already degraded replica; ignored


def compact_events(events: Iterable[KVEvent]) -> list[IndexOp]:
    """The index's view of engine events: kinds and hashes only (token ids dropped). Only the
    device medium is indexed for now; host and disk tier moves are left out, so a hash leaving
    the device pool leaves the index even while a lower tier still holds it."""
    ops: list[IndexOp] = []
    for event in events:
        if isinstance(event, BlockStored | BlockRemoved) and event.medium != "device":
            continue
        if isinstance(event, BlockStored):
            ops.append((OP_STORED, list(event.block_hashes)))
        elif isinstance(event, BlockRemoved):
            ops.append((OP_REMOVED, list(event.block_hashes)))
        elif isinstance(event, AllBlocksCleared):
            ops.append((OP_CLEARED, []))
    return ops


@dataclass
class _Replica:
    pool: str
    slot: int
    last_seq: int
    degraded: bool = False
    hashes: set[BlockHash] = field(default_factory=set)


@dataclass(frozen=True)
class IndexStats:
    """Size of the index, for metrics."""

    num_replicas: int
    num_degraded_replicas: int
    num_entries: int  # (replica, hash) pairs
    num_hashes: int  # distinct hashes over all pools


class KVIndex:
    """Per pool: block hash -> replicas caching it; per replica: last seq and degraded flag."""

    def __init__(self, *, max_blocks_per_replica: int = DEFAULT_MAX_BLOCKS_PER_REPLICA) -> None:
        self.max_blocks_per_replica = max_blocks_per_replica
        self._replicas: dict[str, _Replica] = {}
        self._holders: dict[str, dict[BlockHash, int]] = {}  # pool -> hash -> slot bitmask
        self._slot_owner: dict[int, str] = {}
        self._free_slots: list[int] = []

    # -- updates --------------------------------------------------------------------------

    def apply(self, replica_id: str, batch: KVEventBatch) -> ApplyStatus:
        """Apply one engine event batch of ``replica_id`` (see the module docstring)."""
        return self.apply_ops(replica_id, batch.replica_seq, compact_events(batch.events))

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
        for kind, hashes in ops:
            if kind == OP_STORED:
                self._store(replica, hashes)
            elif kind == OP_REMOVED:
                self._remove(replica, hashes)
            elif kind == OP_CLEARED:
                self._remove(replica, list(replica.hashes))
        if len(replica.hashes) > self.max_blocks_per_replica:
            logger.warning(
                "replica %s reports %d cached blocks (limit %d): degraded",
                replica_id,
                len(replica.hashes),
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
    ) -> None:
        """Replace the replica's entries by a snapshot covering every batch before ``seq``
        (the next batch applied is ``seq``). A new replica needs its ``pool``; a known one
        keeps its pool unless another is given (then it moves)."""
        replica = self._replicas.get(replica_id)
        if pool is None:
            if replica is None:
                raise ValueError(f"replica {replica_id!r} is unknown: resync needs its pool")
            pool = replica.pool
        if replica is not None and replica.pool != pool:
            self.remove_replica(replica_id)
            replica = None
        if replica is None:
            replica = _Replica(pool=pool, slot=self._take_slot(replica_id), last_seq=seq - 1)
            self._replicas[replica_id] = replica
        self._remove(replica, list(replica.hashes))
        replica.last_seq = seq - 1
        replica.degraded = False
        self._store(replica, list(snapshot_hashes))
        if len(replica.hashes) > self.max_blocks_per_replica:
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
        self._remove(replica, list(replica.hashes))
        del self._slot_owner[replica.slot]
        self._free_slots.append(replica.slot)
        return True

    # -- queries --------------------------------------------------------------------------

    def match(self, pool: str, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        """``{replica_id: leading blocks cached}`` for healthy replicas of ``pool`` with a hit."""
        holders = self._holders.get(pool)
        if not holders or not block_hashes:
            return {}
        alive = holders.get(block_hashes[0], 0) & self._healthy_mask(pool)
        result: dict[str, int] = {}
        num_matched = 0
        while alive:
            num_matched += 1
            if num_matched == len(block_hashes):
                break
            still = alive & holders.get(block_hashes[num_matched], 0)
            self._record(alive & ~still, num_matched, result)
            alive = still
        self._record(alive, num_matched, result)
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

    def cached_hashes(self, replica_id: str) -> set[BlockHash]:
        """A copy of the hashes the index believes ``replica_id`` caches."""
        replica = self._replicas.get(replica_id)
        return set() if replica is None else set(replica.hashes)

    def stats(self) -> IndexStats:
        """Sizes for the metrics hooks (index size, degraded replicas)."""
        return IndexStats(
            num_replicas=len(self._replicas),
            num_degraded_replicas=sum(1 for r in self._replicas.values() if r.degraded),
            num_entries=sum(len(r.hashes) for r in self._replicas.values()),
            num_hashes=sum(len(h) for h in self._holders.values()),
        )

    # -- internals ------------------------------------------------------------------------

    def _record(self, mask: int, num_blocks: int, result: dict[str, int]) -> None:
        while mask:
            low = mask & -mask
            result[self._slot_owner[low.bit_length() - 1]] = num_blocks
            mask ^= low

    def _healthy_mask(self, pool: str) -> int:
        mask = 0
        for replica in self._replicas.values():
            if replica.pool == pool and not replica.degraded:
                mask |= 1 << replica.slot
        return mask

    def _take_slot(self, replica_id: str) -> int:
        slot = self._free_slots.pop() if self._free_slots else len(self._slot_owner)
        self._slot_owner[slot] = replica_id
        return slot

    def _degrade(self, replica: _Replica) -> None:
        self._remove(replica, list(replica.hashes))
        replica.degraded = True

    def _store(self, replica: _Replica, hashes: Iterable[BlockHash]) -> None:
        holders = self._holders.setdefault(replica.pool, {})
        bit = 1 << replica.slot
        for block_hash in hashes:
            replica.hashes.add(block_hash)
            holders[block_hash] = holders.get(block_hash, 0) | bit

    def _remove(self, replica: _Replica, hashes: Iterable[BlockHash]) -> None:
        holders = self._holders.get(replica.pool, {})
        bit = 1 << replica.slot
        for block_hash in hashes:
            if block_hash not in replica.hashes:
                continue
            replica.hashes.discard(block_hash)
            remaining = holders.get(block_hash, 0) & ~bit
            if remaining:
                holders[block_hash] = remaining
            else:
                holders.pop(block_hash, None)
