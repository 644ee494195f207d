"""Sampled hashes (``routing.kv_index_stride``): replicas publish one block hash in N, lookups
walk the prompt's sampled blocks and widen the hit back to blocks."""

from __future__ import annotations

import random

import pytest

from cluster.routing.kv_index.compaction import compact_events
from cluster.routing.kv_index.event_relay import KVEventRelay
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.index import KVIndex
from core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from core.kv_index_messages import IndexOp


def stored(*hashes: int, medium: str = "device") -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes),
        parent_hash=None,
        token_ids=[0] * len(hashes),
        block_size=1,
        medium=medium,  # type: ignore[arg-type]
    )


def test_events_keep_only_the_sampled_hashes() -> None:
    events = [stored(4, 1, 8), BlockRemoved(block_hashes=[3, 5]), stored(12, medium="disk")]
    assert compact_events(events, 4) == [
        IndexOp("stored", [4, 8], "device"),
        IndexOp("stored", [12], "disk"),
    ]
    relay = KVEventRelay(stride=4)
    relay(KVEventBatch(replica_seq=0, events=events))
    outgoing = relay.take()  # the registration snapshot holds the sampled hashes only
    assert sorted(outgoing.snapshot_hashes or []) == [4, 8]
    assert outgoing.snapshot_tiers == {"disk": [12]}


def test_a_hit_ends_at_the_last_sampled_block_held() -> None:
    prompt = [4, 1, 8, 2, 3, 12, 7]  # sampled (divisible by 4) at positions 0, 2 and 5
    index = KVIndex(stride=4)
    index.resync("all", [4, 8, 12], 0, pool="prefill")
    index.resync("half", [4, 8], 0, pool="prefill")
    index.resync("tiers", [4], 0, pool="prefill", tiers={"host": [8], "disk": [12]})
    assert index.match("prefill", prompt) == {"all": 6, "half": 3, "tiers": 6}
    # the sampled block at position 2 stands for blocks 1-2, the one at 5 for blocks 3-5
    assert index.match_tiers("prefill", prompt)["tiers"] == TierHit(1, 2, 3)
    assert index.match("prefill", [1, 2, 3]) == {}  # no sampled block: nothing known


@pytest.mark.parametrize("stride", [2, 8])
def test_a_sampled_hit_is_the_exact_hit_cut_back_to_a_sampled_block(stride: int) -> None:
    rng = random.Random(stride)
    exact, sampled = KVIndex(), KVIndex(stride=stride)
    prompts = [[rng.getrandbits(32) for _ in range(40)] for _ in range(6)]
    for r in range(10):
        prompt = prompts[r % len(prompts)]
        held = prompt[: rng.randrange(len(prompt) + 1)]
        batch = KVEventBatch(replica_seq=0, events=[stored(*held)] if held else [])
        for index in (exact, sampled):
            index.resync(f"r{r}", [], 0, pool="decode")
            index.apply(f"r{r}", batch)
    for prompt in prompts:
        exact_hits = exact.match("decode", prompt)
        sampled_hits = sampled.match("decode", prompt)
        for replica_id, num_blocks in exact_hits.items():
            want = max((i + 1 for i in range(num_blocks) if prompt[i] % stride == 0), default=0)
            assert sampled_hits.get(replica_id, 0) == want
        assert set(sampled_hits) <= set(exact_hits)
