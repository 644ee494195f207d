"""Prefix-cache hits through the scheduler, and the KV event stream it publishes."""

from __future__ import annotations

from typing import Any

from core.hashing import hash_prompt_blocks
from core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

SEED = 3  # the harness's hash seed


def test_requests_sharing_a_prefix_share_blocks_and_report_cached_tokens(
    make_harness: Any, reference: Any
) -> None:
    h = make_harness()
    shared = list(range(1, 13))  # 3 full blocks
    h.add("a", [*shared, 20, 21], max_tokens=4)
    h.step()
    h.add("b", [*shared, 30], max_tokens=4)
    plan = h.step()
    [b_item] = [s for s in plan.scheduled if s.request_id == "b"]
    assert b_item.block_ids[:3] == h.scheduler.block_table("a")[:3] == [1, 2, 3]
    assert (b_item.start_position, b_item.token_ids) == (12, [30])
    assert [h.scheduler.kv.pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [2, 2, 2]
    h.run()
    assert h.outputs["b"] == reference([*shared, 30], 4)
    assert (h.cached_tokens["a"], h.cached_tokens["b"]) == (0, 12)
    h.assert_pool_whole()


def test_an_identical_block_aligned_prompt_still_computes_its_last_block(
    make_harness: Any, reference: Any
) -> None:
    h = make_harness()
    prompt = list(range(5, 13))  # exactly 2 blocks
    h.add("a", prompt, max_tokens=2)
    h.run()
    h.add("b", prompt, max_tokens=2)
    [item] = h.step().scheduled
    assert (item.start_position, item.token_ids, item.samples_token) == (4, prompt[4:], True)
    assert item.block_ids[0] == 1
    h.run()
    assert h.outputs["b"] == reference(prompt, 2)


def test_only_computed_blocks_are_cached_during_chunked_prefill(make_harness: Any) -> None:
    h = make_harness(budget=6)
    h.add("a", list(range(1, 21)), max_tokens=2)
    cached = []
    for _ in range(4):
        h.step()
        cached.append(h.scheduler.kv.num_cached_blocks)
    assert cached == [1, 3, 4, 5]  # 6, 12, 18, 20 computed tokens


def test_event_stream_is_ordered_numbered_and_matches_core_hashes(make_harness: Any) -> None:
    h = make_harness(num_blocks=5, budget=16)  # 4 usable blocks
    prompt_a = list(range(1, 10))  # 2 full blocks + 1 token
    h.add("a", prompt_a, max_tokens=1)
    h.run()
    h.add("b", list(range(30, 46)), max_tokens=1)  # 4 blocks: evicts a's cached blocks
    h.run()
    h.scheduler.reset_prefix_cache()
    assert [b.replica_seq for b in h.batches] == list(range(len(h.batches)))
    events = [event for batch in h.batches for event in batch.events]
    hashes_a = hash_prompt_blocks(prompt_a, 4, seed=SEED)
    hashes_b = hash_prompt_blocks(list(range(30, 46)), 4, seed=SEED)
    assert events == [
        BlockStored(block_hashes=hashes_a, parent_hash=None, token_ids=prompt_a[:8], block_size=4),
        BlockRemoved(block_hashes=[hashes_a[1], hashes_a[0]]),  # tail first
        BlockStored(
            block_hashes=hashes_b, parent_hash=None, token_ids=list(range(30, 46)), block_size=4
        ),
        AllBlocksCleared(),
    ]


def test_no_events_and_no_hits_without_prefix_caching(make_harness: Any) -> None:
    h = make_harness(caching=False)
    h.add("a", list(range(1, 13)), max_tokens=2)
    h.run()
    h.add("b", list(range(1, 13)), max_tokens=2)
    [item] = h.step().scheduled
    assert item.start_position == 0
    assert h.batches == []
