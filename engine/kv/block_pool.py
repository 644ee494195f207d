"""The block pool: a fixed set of KV block ids, their ref counts, and the prefix-cache hash map.

Every block is in exactly one state:

* **null** — block 0 is reserved as the padding block (block tables are padded with 0 and
  unused slots point there); it is never allocated, freed or cached.
* **in use** — ``ref_cnt > 0``; held by one or more block tables; may carry a hash (shared
  prefix) or not.
* **cached** — ``ref_cnt == 0`` but still carrying a block hash: free for reuse, yet a prefix hit
  can revive it (:meth:`BlockPool.touch`). Kept in LRU order; :meth:`BlockPool.allocate` evicts
  the least recently freed first and reports each eviction as a ``BlockRemoved`` event.
* **free** — ``ref_cnt == 0`` and no hash. Handed out first-in first-out (initially in id order
  1, 2, 3, ...), always before any cached block is evicted.

:meth:`BlockPool.free` releases ids in the order given; callers freeing a request's table pass
it tail first so that, among blocks freed together, the prefix is evicted last.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from core.errors import KVCacheError
from core.hashing import BlockHash
from core.kv_events import AllBlocksCleared, BlockRemoved
from engine.kv.event_publisher import KVEventPublisher

NULL_BLOCK_ID = 0

EvictHook = Callable[[int, BlockHash], None]
"""Called with (block id, hash) just before a cached block loses its hash (evicted or expired),
while its KV is still intact: the KV tiers copy it down here."""


@dataclass(slots=True)
class KVBlock:
    """Bookkeeping of one block id: how many tables hold it and its prefix-cache hash."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Ref-counted block ids 1..num_blocks-1 with an LRU of cached-but-free blocks."""

    def __init__(
        self,
        num_blocks: int,
        publisher: KVEventPublisher | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_blocks < 2:
            raise KVCacheError(f"a block pool needs at least 2 blocks (1 null), got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(block_id) for block_id in range(num_blocks)]
        self._free: deque[int] = deque(range(1, num_blocks))
        self._cached_free: OrderedDict[int, float] = OrderedDict()  # LRU first: id -> freed at
        self._kept: set[int] = set()  # cached-free blocks freed with a keep-alive (later stamp)
        self._hash_to_block: dict[BlockHash, int] = {}
        self._publisher = publisher or KVEventPublisher()
        self._clock = clock
        self._evict_listeners: list[EvictHook] = []

    def register_evict_listener(self, listener: EvictHook) -> None:
        """Call ``listener(block id, hash)`` for each cached block just before its hash is
        dropped (evicted for reuse or expired), in registration order."""
        self._evict_listeners.append(listener)

    # -- inspection ---------------------------------------------------------------------------

    @property
    def num_usable_blocks(self) -> int:
        """Every block except the null block."""
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free plus cached-but-free (evictable)."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks nobody holds (``ref_cnt == 0``); reused LRU first."""
        return len(self._cached_free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, held or not."""
        return len(self._hash_to_block)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one table."""
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by tables (0.0 .. 1.0)."""
        return self.num_used_blocks / self.num_usable_blocks

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The block id caching ``block_hash``, if any."""
        return self._hash_to_block.get(block_hash)

    def evictable_order(self) -> list[int]:
        """Cached-but-free block ids, next to be evicted first (for tests and debugging)."""
        return list(self._cached_free)

    # -- allocation ---------------------------------------------------------------------------

    def can_allocate(self, num_blocks: int) -> bool:
        """True when ``allocate(num_blocks)`` would succeed."""
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` ids (ref 1 each): free ones first, then evict cached ones LRU."""
        if not self.can_allocate(num_blocks):
            raise KVCacheError(
                f"cannot allocate {num_blocks} KV blocks: only {self.num_free_blocks} free"
            )
        block_ids: list[int] = []
        evicted: list[BlockHash] = []
        for _ in range(num_blocks):
            if self._free:
                block_id = self._free.popleft()
            else:
                block_id, _ = self._cached_free.popitem(last=False)
                self._kept.discard(block_id)
                evicted.append(self._evict(block_id))
            self.blocks[block_id].ref_cnt = 1
            block_ids.append(block_id)
        if evicted:
            self._publisher.record(BlockRemoved(block_hashes=evicted))
        return block_ids

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference on each block (a prefix hit); revives cached-free blocks."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                if block_id not in self._cached_free:
                    raise KVCacheError(f"cannot touch KV block {block_id}: free and uncached")
                del self._cached_free[block_id]
                self._kept.discard(block_id)
            block.ref_cnt += 1

    def free(self, block_ids: Sequence[int], keep_s: float = 0.0) -> None:
        """Drop one reference on each block, in order; unreferenced ones become reusable.
        ``keep_s`` starts their idle clock that much later (a session's keep-alive): the TTL
        of :meth:`expire` spares them longer; eviction for space does not."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt <= 0 or block_id == NULL_BLOCK_ID:
                raise KVCacheError(f"double free of KV block {block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self._free.append(block_id)
                else:
                    self._cached_free[block_id] = self._clock() + keep_s
                    if keep_s > 0:
                        self._kept.add(block_id)

    def expire(self, idle_s: float) -> int:
        """Release cached-free blocks unused for ``idle_s`` seconds (copied down through
        the evict listeners first); returns how many. One ``BlockRemoved`` event for them all."""
        cutoff = self._clock() - idle_s
        due: list[int] = []
        for block_id, freed_at in self._cached_free.items():
            if freed_at >= cutoff:
                if block_id in self._kept:
                    continue  # a keep-alive stamp is out of order: look past it
                break  # LRU order is free order: the rest are younger
            due.append(block_id)
        expired: list[BlockHash] = []
        for block_id in due:
            del self._cached_free[block_id]
            self._kept.discard(block_id)
            expired.append(self._evict(block_id))
            self._free.append(block_id)
        if expired:
            self._publisher.record(BlockRemoved(block_hashes=expired))
        return len(expired)

    def _evict(self, block_id: int) -> BlockHash:
        block_hash = self.blocks[block_id].block_hash
        if block_hash is not None:
            for listener in self._evict_listeners:
                listener(block_id, block_hash)
        return self._drop_hash(block_id)

    # -- prefix cache -------------------------------------------------------------------------

    def cache_block(self, block_id: int, block_hash: BlockHash) -> bool:
        """Register a held, full block under ``block_hash``; False if the hash is already cached
        (by another block with the same content) or this block already has a hash."""
        block = self.blocks[block_id]
        if block.ref_cnt <= 0:
            raise KVCacheError(f"cannot cache KV block {block_id}: it is not held")
        if block.block_hash is not None or block_hash in self._hash_to_block:
            return False
        block.block_hash = block_hash
        self._hash_to_block[block_hash] = block_id
        return True

    def reset_prefix_cache(self) -> None:
        """Forget every hash (held blocks keep their data but stop being shareable)."""
        for block_id in list(self._hash_to_block.values()):
            self._drop_hash(block_id)
        self._free.extend(self._cached_free)
        self._cached_free.clear()
        self._kept.clear()
        self._publisher.record(AllBlocksCleared())

    def _drop_hash(self, block_id: int) -> BlockHash:
        block = self.blocks[block_id]
        block_hash = block.block_hash
        if block_hash is None:
            raise KVCacheError(f"KV block {block_id} has no hash to drop")
        del self._hash_to_block[block_hash]
        block.block_hash = None
        return block_hash

    # -- integrity ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise :class:`KVCacheError` unless free + cached + in-use == usable blocks and every
        block's ref count, queue membership and hash agree."""
        free_ids, cached_ids = set(self._free), set(self._cached_free)
        _require(len(free_ids) == len(self._free), "duplicate ids in the free queue")
        _require(not free_ids & cached_ids, "a block is both free and cached")
        null = self.blocks[NULL_BLOCK_ID]
        _require(
            null.ref_cnt == 0 and null.block_hash is None and NULL_BLOCK_ID not in free_ids,
            "the null block was used",
        )
        for block in self.blocks[1:]:
            _check_block(block, block.block_id in free_ids, block.block_id in cached_ids)
        in_use = sum(1 for block in self.blocks[1:] if block.ref_cnt > 0)
        _require(
            len(free_ids) + len(cached_ids) + in_use == self.num_usable_blocks,
            f"free {len(free_ids)} + cached {len(cached_ids)} + in-use {in_use} != "
            f"{self.num_usable_blocks} usable blocks",
        )
        for block_hash, block_id in self._hash_to_block.items():
            _require(
                self.blocks[block_id].block_hash == block_hash,
                f"hash map points at block {block_id}, which holds another hash",
            )
        hashed = sum(1 for block in self.blocks if block.block_hash is not None)
        _require(hashed == len(self._hash_to_block), "a block's hash is missing from the map")


def _check_block(block: KVBlock, in_free: bool, in_cached: bool) -> None:
    where = f"KV block {block.block_id} (ref {block.ref_cnt}, hash {block.block_hash})"
    _require(block.ref_cnt >= 0, f"{where} has a negative ref count")
    if block.ref_cnt > 0:
        _require(not in_free and not in_cached, f"{where} is held but also queued as free")
    elif block.block_hash is None:
        _require(in_free, f"{where} is unreferenced but not in the free queue")
    else:
        _require(in_cached, f"{where} is unreferenced and hashed but not in the cached LRU")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise KVCacheError(f"KV block pool integrity: {message}")
