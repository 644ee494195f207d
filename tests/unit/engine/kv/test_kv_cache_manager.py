"""KV cache manager: block tables, prefix hits via core hashing, caching of full blocks, events."""

from __future__ import annotations

import pytest

from core.errors import KVCacheError
from core.hashing import hash_prompt_blocks
from core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from core.sampling import SamplingParams
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.kv_cache_manager import KVCacheManager
from engine.request import Request

BLOCK_SIZE = 4
SEED = 1234


def make_manager(
    num_blocks: int = 10, *, caching: bool = True
) -> tuple[KVCacheManager, KVEventPublisher, list[KVEventBatch]]:
    batches: list[KVEventBatch] = []
    publisher = KVEventPublisher(batches.append)
    manager = KVCacheManager(
        num_blocks, BLOCK_SIZE, enable_prefix_caching=caching, hash_seed=SEED, publisher=publisher
    )
    return manager, publisher, batches


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(request_id, token_ids, SamplingParams(max_tokens=8))


def compute_prompt(manager: KVCacheManager, request: Request) -> None:
    """Admit the request with its prefix hit and pretend its whole prompt ran."""
    hit = manager.get_computed_blocks(request, request.num_tokens - 1)
    assert manager.allocate_slots(request, request.num_tokens - hit.num_tokens, hit)
    request.num_computed_tokens = request.num_tokens
    manager.cache_full_blocks(request)
    manager.check_integrity()


def events(publisher: KVEventPublisher, batches: list[KVEventBatch]) -> list[object]:
    publisher.flush()
    return [event for batch in batches for event in batch.events]


PROMPT = list(range(100, 110))  # 10 tokens: 2 full blocks + 2 tokens


def test_block_hashes_are_core_hash_prompt_blocks_with_the_seed() -> None:
    manager, _, _ = make_manager()
    request = make_request("a", PROMPT)
    expected = hash_prompt_blocks(PROMPT, BLOCK_SIZE, seed=SEED)
    assert manager.block_hashes(request, 99) == expected
    assert len(expected) == 2
    request.append_output_token(7)
    request.append_output_token(8)  # the third block is now full
    assert manager.block_hashes(request, 99) == hash_prompt_blocks(
        [*PROMPT, 7, 8], BLOCK_SIZE, seed=SEED
    )


def test_prompt_allocation_and_caching_emit_one_stored_event() -> None:
    manager, publisher, batches = make_manager()
    request = make_request("a", PROMPT)
    compute_prompt(manager, request)
    assert manager.block_ids("a") == [1, 2, 3]
    assert [manager.pool.blocks[b].ref_cnt for b in (1, 2, 3)] == [1, 1, 1]
    hashes = hash_prompt_blocks(PROMPT, BLOCK_SIZE, seed=SEED)
    assert manager.pool.lookup(hashes[0]) == 1
    assert manager.pool.lookup(hashes[1]) == 2
    assert manager.num_cached_blocks == 2
    assert events(publisher, batches) == [
        BlockStored(block_hashes=hashes, parent_hash=None, token_ids=PROMPT[:8], block_size=4)
    ]


def test_requests_sharing_a_prefix_share_block_ids() -> None:
    manager, publisher, batches = make_manager()
    first = make_request("a", PROMPT)
    compute_prompt(manager, first)
    second = make_request("b", [*PROMPT[:8], 55, 56, 57, 58, 59])
    hit = manager.get_computed_blocks(second, second.num_tokens - 1)
    assert hit.block_ids == [1, 2] and hit.num_tokens == 8
    compute_prompt(manager, second)
    assert manager.block_ids("b") == [1, 2, 4, 5]
    assert [manager.pool.blocks[b].ref_cnt for b in range(6)] == [0, 2, 2, 1, 1, 1]
    hashes_b = hash_prompt_blocks(second.all_token_ids, BLOCK_SIZE, seed=SEED)
    stored = events(publisher, batches)[-1]
    assert stored == BlockStored(
        block_hashes=[hashes_b[2]],
        parent_hash=hashes_b[1],
        token_ids=[55, 56, 57, 58],
        block_size=4,
    )


def test_hit_never_covers_the_last_token() -> None:
    manager, _, _ = make_manager()
    compute_prompt(manager, make_request("a", PROMPT[:8]))  # exactly 2 full blocks, cached
    again = make_request("b", PROMPT[:8])
    assert manager.get_computed_blocks(again, again.num_tokens - 1).block_ids == [1]
    # an import may use the whole prompt (no logits needed)
    assert manager.get_computed_blocks(again, again.num_tokens).block_ids == [1, 2]


def test_free_releases_tail_first_so_the_prefix_is_evicted_last() -> None:
    manager, publisher, batches = make_manager(num_blocks=6)
    request = make_request("a", list(range(13)))  # 3 full blocks + 1 token
    compute_prompt(manager, request)
    assert manager.block_ids("a") == [1, 2, 3, 4]
    manager.free("a")
    manager.check_integrity()
    assert manager.pool.evictable_order() == [3, 2, 1]
    assert manager.num_free_blocks == 5
    assert manager.block_ids("a") == []
    other = make_request("b", list(range(50, 58)))
    assert manager.allocate_slots(other, 8)
    assert manager.block_ids("b") == [5, 4]  # never-used 5, then freed uncached 4
    other.num_computed_tokens = 8
    assert manager.allocate_slots(other, 8)  # 16 tokens: evicts the LRU cached block
    assert manager.block_ids("b") == [5, 4, 3, 2]
    hashes = hash_prompt_blocks(list(range(13)), BLOCK_SIZE, seed=SEED)
    assert events(publisher, batches)[-1] == BlockRemoved(block_hashes=[hashes[2], hashes[1]])
    manager.check_integrity()


def test_blocks_filled_during_decode_are_cached() -> None:
    manager, publisher, batches = make_manager()
    request = make_request("a", PROMPT)
    compute_prompt(manager, request)
    for token in (7, 8):  # decode two tokens: the third block becomes full
        request.append_output_token(token)
        assert manager.allocate_slots(request, 1)
        request.num_computed_tokens += 1
        manager.cache_full_blocks(request)
        manager.check_integrity()
    hashes = hash_prompt_blocks([*PROMPT, 7, 8], BLOCK_SIZE, seed=SEED)
    assert manager.pool.lookup(hashes[2]) == 3
    assert events(publisher, batches)[-1] == BlockStored(
        block_hashes=[hashes[2]], parent_hash=hashes[1], token_ids=[108, 109, 7, 8], block_size=4
    )


def test_duplicate_content_is_cached_once() -> None:
    manager, publisher, batches = make_manager()
    first, second = make_request("a", PROMPT), make_request("b", PROMPT)
    for request in (first, second):  # both admitted before either ran: no hit for the second
        assert manager.allocate_slots(request, request.num_tokens)
    for request in (first, second):
        request.num_computed_tokens = request.num_tokens
        manager.cache_full_blocks(request)
    manager.check_integrity()
    assert manager.block_ids("b") == [4, 5, 6]
    assert manager.pool.blocks[4].block_hash is None
    assert len(events(publisher, batches)) == 1


def test_allocation_failure_changes_nothing() -> None:
    manager, _, _ = make_manager(num_blocks=3)
    request = make_request("a", PROMPT)
    assert not manager.can_allocate(request, 10)
    assert not manager.allocate_slots(request, 10)
    assert manager.block_tables() == {}
    assert manager.num_free_blocks == 2
    manager.check_integrity()


def test_disabled_prefix_caching_never_hits_or_hashes() -> None:
    manager, publisher, batches = make_manager(caching=False)
    compute_prompt(manager, make_request("a", PROMPT))
    second = make_request("b", PROMPT)
    assert manager.get_computed_blocks(second, 9).block_ids == []
    compute_prompt(manager, second)
    assert manager.block_ids("b") == [4, 5, 6]
    assert manager.num_cached_blocks == 0
    assert events(publisher, batches) == []


def test_integrity_checks_ref_counts_against_tables() -> None:
    manager, _, _ = make_manager()
    compute_prompt(manager, make_request("a", PROMPT))
    manager.pool.blocks[2].ref_cnt = 2
    with pytest.raises(KVCacheError, match="block 2 has ref 2 but 1 tables"):
        manager.check_integrity()


def test_reset_prefix_cache_stops_offering_held_blocks() -> None:
    manager, _, _ = make_manager()
    request = make_request("a", PROMPT)
    compute_prompt(manager, request)
    manager.reset_prefix_cache()
    request.append_output_token(1)
    request.append_output_token(2)
    request.num_computed_tokens = 12
    assert manager.allocate_slots(request, 0)
    manager.cache_full_blocks(request)
    assert manager.num_cached_blocks == 0
    manager.check_integrity()


def test_a_pinned_prefix_holds_its_cached_leading_run_until_unpinned() -> None:
    manager, _, _ = make_manager()
    request = make_request("a", PROMPT)
    compute_prompt(manager, request)
    hashes = hash_prompt_blocks(PROMPT, BLOCK_SIZE, seed=SEED)
    assert manager.block_ids("a") == [1, 2, 3]
    manager.free("a")
    assert manager.pool.evictable_order() == [2, 1]  # block 3 (partial) has no hash
    # the leading run only: a hash the cache lacks ends it
    assert manager.pin_cached("export-1", [*hashes, 999]) == [1, 2]
    assert manager.num_pinned_prefix_blocks == 2
    assert [manager.pool.blocks[b].ref_cnt for b in (1, 2)] == [1, 1]
    assert manager.pool.evictable_order() == []
    manager.check_integrity()
    with pytest.raises(KVCacheError, match="export-1"):
        manager.pin_cached("export-1", hashes)
    assert manager.pin_cached("export-2", [999, *hashes]) == []  # first block not cached
    assert manager.unpin("export-1") is True
    assert manager.unpin("export-1") is False and manager.unpin("export-2") is False
    assert manager.pool.evictable_order() == [2, 1]  # freed tail first: the prefix goes last
    assert manager.num_pinned_prefix_blocks == 0
    manager.check_integrity()


def test_admitted_blocks_join_the_cache_as_a_leading_run_while_blocks_are_free() -> None:
    manager, publisher, batches = make_manager(num_blocks=4)  # 3 usable blocks
    request = make_request("a", PROMPT)
    compute_prompt(manager, request)  # holds 3 blocks, the first 2 cached
    cached = hash_prompt_blocks(PROMPT, BLOCK_SIZE, seed=SEED)
    manager.free("a")
    events(publisher, batches)
    batches.clear()  # the prompt's own events
    written: list[tuple[int, int]] = []

    def write(index: int, block_id: int) -> None:
        written.append((index, block_id))

    # the 2 cached blocks count as they are; 2 more take the free block and evict nothing of
    # the run: the second new one finds no block left and ends it
    assert manager.admit_blocks([*cached, 901, 902], write) == 3
    assert written == [(2, 3)]
    assert manager.pool.lookup(901) == 3 and manager.pool.lookup(902) is None
    assert manager.pool.evictable_order() == [3, 2, 1]  # unheld, the tail evicted first
    assert events(publisher, batches) == [BlockStored([901], None, [], BLOCK_SIZE)]
    manager.check_integrity()
    disabled, _, _ = make_manager(caching=False)
    assert disabled.admit_blocks([901], write) == 0 and written == [(2, 3)]
