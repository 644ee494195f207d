"""Block pool: exact ids handed out, ref counts, LRU eviction order, events and integrity."""

from __future__ import annotations

import pytest

from core.errors import KVCacheError
from core.kv_events import AllBlocksCleared, BlockRemoved, KVEventBatch
from engine.kv.block_pool import NULL_BLOCK_ID, BlockPool
from engine.kv.event_publisher import KVEventPublisher


def make_pool(num_blocks: int = 8) -> tuple[BlockPool, KVEventPublisher, list[KVEventBatch]]:
    """A pool whose events land, once flushed, in the returned list."""
    batches: list[KVEventBatch] = []
    publisher = KVEventPublisher(batches.append)
    pool = BlockPool(num_blocks, publisher)
    pool.check_integrity()
    return pool, publisher, batches


def refs(pool: BlockPool) -> list[int]:
    return [block.ref_cnt for block in pool.blocks]


def test_fresh_pool_hands_out_ids_in_order_and_never_the_null_block() -> None:
    pool, _, _ = make_pool(5)
    assert pool.num_usable_blocks == 4
    assert pool.num_free_blocks == 4
    assert pool.allocate(2) == [1, 2]
    pool.check_integrity()
    assert pool.allocate(2) == [3, 4]
    pool.check_integrity()
    assert NULL_BLOCK_ID not in pool.blocks[1:]
    assert refs(pool) == [0, 1, 1, 1, 1]
    assert pool.usage == 1.0
    assert not pool.can_allocate(1)
    with pytest.raises(KVCacheError, match="only 0 free"):
        pool.allocate(1)


def test_freed_uncached_blocks_are_reused_fifo_after_never_used_ones() -> None:
    pool, _, _ = make_pool(8)
    assert pool.allocate(3) == [1, 2, 3]
    pool.free([3, 2, 1])
    pool.check_integrity()
    assert pool.num_free_blocks == 7
    # never-used 4..7 come first, then the freed ones in the order they were freed
    assert pool.allocate(7) == [4, 5, 6, 7, 3, 2, 1]
    pool.check_integrity()


def test_shared_block_needs_every_reference_freed() -> None:
    pool, _, _ = make_pool(4)
    [block_id] = pool.allocate(1)
    assert pool.cache_block(block_id, 111)
    pool.touch([block_id])
    assert pool.blocks[block_id].ref_cnt == 2
    pool.free([block_id])
    assert pool.blocks[block_id].ref_cnt == 1
    assert pool.num_evictable_blocks == 0
    pool.free([block_id])
    assert pool.evictable_order() == [block_id]
    pool.check_integrity()
    with pytest.raises(KVCacheError, match="double free"):
        pool.free([block_id])


def test_free_blocks_go_before_cached_ones_which_are_evicted_lru() -> None:
    pool, publisher, batches = make_pool(6)
    ids = pool.allocate(3)
    assert ids == [1, 2, 3]
    for block_id, block_hash in zip(ids, (101, 102, 103), strict=True):
        assert pool.cache_block(block_id, block_hash)
    pool.free([3, 2, 1])  # a table freed tail first: 3 is least recently freed
    assert pool.evictable_order() == [3, 2, 1]
    assert pool.num_cached_blocks == 3
    pool.check_integrity()

    assert pool.allocate(2) == [4, 5]  # uncached free blocks first: no eviction
    assert pool.num_cached_blocks == 3
    assert pool.allocate(2) == [3, 2]  # then LRU eviction
    assert pool.lookup(103) is None and pool.lookup(102) is None
    assert pool.lookup(101) == 1
    assert all(block.block_hash is None for block in pool.blocks[2:4])
    pool.check_integrity()
    publisher.flush()
    assert [batch.events for batch in batches] == [[BlockRemoved(block_hashes=[103, 102])]]


def test_touch_revives_a_cached_free_block_and_moves_it_out_of_the_lru() -> None:
    pool, _, _ = make_pool(5)
    ids = pool.allocate(2)
    pool.cache_block(ids[0], 7)
    pool.cache_block(ids[1], 8)
    pool.free(ids)
    assert pool.evictable_order() == [1, 2]
    pool.touch([1])
    assert pool.blocks[1].ref_cnt == 1
    assert pool.evictable_order() == [2]
    pool.check_integrity()
    pool.free([1])  # now the most recently freed: evicted after block 2
    assert pool.evictable_order() == [2, 1]
    with pytest.raises(KVCacheError, match="free and uncached"):
        pool.touch([3])


def test_cache_block_refuses_a_duplicate_hash_and_an_unheld_block() -> None:
    pool, _, _ = make_pool(5)
    first, second = pool.allocate(2)
    assert pool.cache_block(first, 42)
    assert not pool.cache_block(second, 42)
    assert not pool.cache_block(first, 43)
    assert pool.lookup(42) == first
    assert pool.blocks[second].block_hash is None
    with pytest.raises(KVCacheError, match="not held"):
        pool.cache_block(3, 44)
    pool.check_integrity()


def test_reset_prefix_cache_clears_hashes_and_emits_cleared() -> None:
    pool, publisher, batches = make_pool(5)
    first, second = pool.allocate(2)
    pool.cache_block(first, 1)
    pool.cache_block(second, 2)
    pool.free([second])
    pool.reset_prefix_cache()
    pool.check_integrity()
    assert pool.num_cached_blocks == 0
    assert pool.num_evictable_blocks == 0
    assert pool.num_free_blocks == 3
    assert pool.blocks[first].block_hash is None
    publisher.flush()
    assert batches[0].events == [AllBlocksCleared()]


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda pool: setattr(pool.blocks[2], "ref_cnt", 1),  # free yet referenced
        lambda pool: setattr(pool.blocks[1], "ref_cnt", 0),  # unreferenced, not queued
        lambda pool: setattr(pool.blocks[1], "block_hash", 99),  # hash missing from the map
        lambda pool: pool._free.append(3),  # duplicate in the free queue
        lambda pool: setattr(pool.blocks[0], "ref_cnt", 1),  # null block used
    ],
)
def test_check_integrity_catches_corruption(corrupt: object) -> None:
    pool, _, _ = make_pool(5)
    pool.allocate(1)
    pool.check_integrity()
    corrupt(pool)  # type: ignore[operator]
    with pytest.raises(KVCacheError, match="integrity"):
        pool.check_integrity()


def test_pool_needs_a_usable_block() -> None:
    with pytest.raises(KVCacheError, match="at least 2"):
        BlockPool(1)


def test_expire_releases_idle_cached_blocks_oldest_first_through_the_evict_hook() -> None:
    now = [100.0]
    batches: list[KVEventBatch] = []
    publisher = KVEventPublisher(batches.append)
    pool = BlockPool(6, publisher, clock=lambda: now[0])
    copied: list[tuple[int, int]] = []
    pool.register_evict_listener(lambda block_id, block_hash: copied.append((block_id, block_hash)))
    ids = pool.allocate(3)
    for block_id, block_hash in zip(ids, (11, 12, 13), strict=True):
        pool.cache_block(block_id, block_hash)
    pool.free([ids[0]])
    now[0] += 5
    pool.free([ids[1], ids[2]])
    now[0] += 6  # ids[0] idle 11 s, the others 6 s
    assert pool.expire(10.0) == 1
    assert copied == [(ids[0], 11)]
    assert pool.lookup(11) is None and pool.lookup(12) == ids[1]
    assert pool.evictable_order() == [ids[1], ids[2]]
    publisher.flush()
    assert batches[-1].events == [BlockRemoved(block_hashes=[11])]
    now[0] += 10
    assert pool.expire(10.0) == 2
    assert copied[1:] == [(ids[1], 12), (ids[2], 13)]
    assert pool.num_cached_blocks == 0 and pool.num_free_blocks == 5
    pool.check_integrity()


def test_eviction_for_space_calls_the_hook_before_the_block_is_reused() -> None:
    pool, _, _ = make_pool(3)
    seen: list[tuple[int, int]] = []
    pool.register_evict_listener(lambda block_id, block_hash: seen.append((block_id, block_hash)))
    (a, b) = pool.allocate(2)
    pool.cache_block(a, 21)
    pool.free([a, b])
    assert pool.allocate(2) == [b, a]
    assert seen == [(a, 21)]


def test_a_keep_alive_spares_blocks_from_the_ttl_but_not_from_eviction_for_space() -> None:
    now = [100.0]
    pool = BlockPool(5, clock=lambda: now[0])
    ids = pool.allocate(4)
    for block_id, block_hash in zip(ids, (11, 12, 13, 14), strict=True):
        pool.cache_block(block_id, block_hash)
    pool.free([ids[0]], keep_s=30.0)  # a session asked to keep this one for 30 s more
    pool.free([ids[1], ids[2]])
    now[0] += 11
    # the kept block is first in LRU order but not due: the expiry looks past it
    assert pool.expire(10.0) == 2
    assert pool.lookup(11) == ids[0] and pool.lookup(12) is None and pool.lookup(13) is None
    now[0] += 25  # 36 s since the free: 30 s keep-alive + 6 s idle
    assert pool.expire(10.0) == 0
    now[0] += 5
    assert pool.expire(10.0) == 1
    pool.free([ids[3]], keep_s=1000.0)
    assert pool.allocate(4)  # space still wins over a keep-alive
    assert pool.lookup(14) is None
    pool.check_integrity()
