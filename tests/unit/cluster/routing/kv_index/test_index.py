"""KV index: stored/removed/cleared events, longest-prefix matching, gaps, resync, removal."""

from __future__ import annotations

import random

import pytest

from cluster.routing.kv_index.compaction import compact_events
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.index import ApplyStatus, KVIndex
from core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, KVMedium
from core.kv_index_messages import IndexOp
from tests.unit.cluster.routing.kv_index.engine_walk import engine_walk


def stored(*hashes: int) -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes), parent_hash=None, token_ids=[0] * 2 * len(hashes), block_size=2
    )


def batch(seq: int, *events: BlockStored | BlockRemoved | AllBlocksCleared) -> KVEventBatch:
    return KVEventBatch(replica_seq=seq, events=list(events))


def registered(*replicas: tuple[str, str]) -> KVIndex:
    index = KVIndex()
    for replica_id, pool in replicas:
        index.resync(replica_id, [], 0, pool=pool)
    return index


def test_stored_removed_and_cleared_update_the_match() -> None:
    index = registered(("a", "prefill"))
    assert index.apply("a", batch(0, stored(1, 2, 3))) is ApplyStatus.APPLIED
    assert index.match("prefill", [1, 2, 3, 4]) == {"a": 3}
    assert index.apply("a", batch(1, BlockRemoved(block_hashes=[3]))) is ApplyStatus.APPLIED
    assert index.match("prefill", [1, 2, 3, 4]) == {"a": 2}
    assert index.apply("a", batch(2, AllBlocksCleared(), stored(1))) is ApplyStatus.APPLIED
    assert index.match("prefill", [1, 2]) == {"a": 1}
    assert index.cached_hashes("a") == {1}
    assert index.last_seq("a") == 2


def test_match_stops_at_each_replicas_first_miss() -> None:
    index = registered(("a", "prefill"), ("b", "prefill"), ("c", "prefill"))
    index.apply("a", batch(0, stored(1, 2, 3, 4)))
    index.apply("b", batch(0, stored(1, 2)))
    # c caches a later block but not the first one: no usable prefix at all
    index.apply("c", batch(0, stored(2, 3, 4)))
    assert index.match("prefill", [1, 2, 3, 4, 5]) == {"a": 4, "b": 2}
    # a hole in a's chain (block 2 evicted) ends a's prefix there even though 3, 4 remain
    index.apply("a", batch(1, BlockRemoved(block_hashes=[2])))
    assert index.match("prefill", [1, 2, 3, 4]) == {"a": 1, "b": 2}
    assert index.match("prefill", [9]) == {}
    assert index.match("prefill", []) == {}


def test_pools_are_separate() -> None:
    index = registered(("p", "prefill"), ("d", "decode"))
    index.apply("p", batch(0, stored(1, 2)))
    index.apply("d", batch(0, stored(1)))
    assert index.match("prefill", [1, 2]) == {"p": 2}
    assert index.match("decode", [1, 2]) == {"d": 1}
    assert index.match("other", [1]) == {}
    assert index.replica_ids("decode") == ["d"]
    assert index.pool_of("p") == "prefill"


def test_stale_batches_are_ignored_and_unknown_replicas_need_a_resync() -> None:
    index = registered(("a", "prefill"))
    index.apply("a", batch(0, stored(1)))
    assert index.apply("a", batch(0, stored(7))) is ApplyStatus.STALE
    assert index.match("prefill", [7]) == {}
    assert index.apply("ghost", batch(0, stored(5))) is ApplyStatus.NEEDS_RESYNC
    assert index.needs_resync("ghost") and not index.needs_resync("a")
    assert index.match("prefill", [5]) == {}


def test_a_gap_degrades_the_replica_until_a_resync() -> None:
    index = registered(("a", "prefill"), ("b", "prefill"))
    index.apply("a", batch(0, stored(1, 2)))
    index.apply("b", batch(0, stored(1)))
    assert index.apply("a", batch(2, stored(3))) is ApplyStatus.GAP  # seq 1 was lost
    assert index.is_degraded("a") and index.needs_resync("a")
    assert index.match("prefill", [1, 2]) == {"b": 1}  # a's entries are not trusted
    assert index.stats().num_degraded_replicas == 1
    # later batches are ignored until the snapshot arrives
    assert index.apply("a", batch(3, stored(4))) is ApplyStatus.NEEDS_RESYNC
    index.resync("a", [1, 2, 3], 4)  # a known replica keeps its pool
    assert not index.is_degraded("a")
    assert index.match("prefill", [1, 2, 3]) == {"a": 3, "b": 1}
    assert index.apply("a", batch(3, stored(9))) is ApplyStatus.STALE  # covered by the snapshot
    assert index.apply("a", batch(4, BlockRemoved(block_hashes=[3]))) is ApplyStatus.APPLIED
    assert index.match("prefill", [1, 2, 3]) == {"a": 2, "b": 1}


def test_a_new_replica_needs_its_pool() -> None:
    with pytest.raises(ValueError, match="needs its pool"):
        KVIndex().resync("a", [1], 0)


def test_remove_replica_forgets_it_and_reuses_its_slot() -> None:
    index = registered(("a", "prefill"), ("b", "prefill"))
    index.apply("a", batch(0, stored(1, 2)))
    index.apply("b", batch(0, stored(1, 2)))
    assert index.remove_replica("a")
    assert not index.remove_replica("a")
    assert index.match("prefill", [1, 2]) == {"b": 2}
    index.resync("c", [1], 0, pool="prefill")  # takes a's freed slot
    assert index.match("prefill", [1, 2]) == {"b": 2, "c": 1}
    assert index.stats().num_replicas == 2
    assert index.stats().num_hashes == 2  # hashes 1 and 2 still held by b (and c)


def test_resync_into_another_pool_moves_the_replica() -> None:
    index = registered(("a", "prefill"))
    index.apply("a", batch(0, stored(1)))
    index.resync("a", [5], 0, pool="decode")
    assert index.match("prefill", [1]) == {}
    assert index.match("decode", [5]) == {"a": 1}


def test_a_replica_past_the_entry_limit_is_degraded() -> None:
    index = KVIndex(max_blocks_per_replica=3)
    index.resync("a", [], 0, pool="prefill")
    assert index.apply("a", batch(0, stored(1, 2, 3, 4))) is ApplyStatus.GAP
    assert index.is_degraded("a")
    assert index.stats().num_entries == 0


def test_stats_count_entries_and_distinct_hashes() -> None:
    index = registered(("a", "prefill"), ("b", "prefill"))
    index.apply("a", batch(0, stored(1, 2)))
    index.apply("b", batch(0, stored(2, 3)))
    stats = index.stats()
    assert (stats.num_replicas, stats.num_entries, stats.num_hashes) == (2, 4, 3)


def test_compact_events_drop_token_ids() -> None:
    events = [
        stored(1, 2),
        BlockRemoved(block_hashes=[2]),
        AllBlocksCleared(),
        BlockStored(
            block_hashes=[3], parent_hash=None, token_ids=[0, 0], block_size=2, medium="disk"
        ),
        BlockRemoved(block_hashes=[3], medium="host"),
    ]
    assert compact_events(events) == [
        IndexOp("stored", [1, 2], "device"),
        IndexOp("removed", [2], "device"),
        IndexOp("cleared", [], "device"),
        IndexOp("stored", [3], "disk"),
        IndexOp("removed", [3], "host"),
    ]


@pytest.mark.parametrize("num_replicas", [1, 5, 40])
def test_match_agrees_with_a_brute_force_prefix_scan(num_replicas: int) -> None:
    index = KVIndex()
    held: dict[str, set[int]] = {}
    for r in range(num_replicas):
        replica_id = f"r{r}"
        hashes = {h for h in range(12) if (h * 7 + r * 3) % 5 != 0}
        held[replica_id] = hashes
        index.resync(replica_id, hashes, 0, pool="prefill")
    prompt = list(range(12))
    expected = {}
    for replica_id, hashes in held.items():
        count = 0
        while count < len(prompt) and prompt[count] in hashes:
            count += 1
        if count:
            expected[replica_id] = count
    assert index.match("prefill", prompt) == expected


def moved(medium: KVMedium, *hashes: int) -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes),
        parent_hash=None,
        token_ids=[0] * 2 * len(hashes),
        block_size=2,
        medium=medium,
    )


def test_a_hit_is_a_device_run_then_a_host_or_disk_run() -> None:
    index = registered(("a", "decode"))
    index.apply("a", batch(0, stored(1, 2, 3, 4)))
    # 3 and 4 are demoted: 3 to host, 4 to host then disk; the device copies are evicted
    index.apply("a", batch(1, moved("host", 3, 4), BlockRemoved(block_hashes=[3, 4])))
    index.apply("a", batch(2, moved("disk", 4), BlockRemoved(block_hashes=[4], medium="host")))
    assert index.match_tiers("decode", [1, 2, 3, 4, 5]) == {"a": TierHit(2, 1, 1)}
    assert index.match("decode", [1, 2, 3, 4, 5]) == {"a": 4}
    assert index.cached_hashes("a") == {1, 2}
    assert index.cached_hashes("a", "host") == {3}
    assert index.cached_hashes("a", "disk") == {4}
    # a block held in both host and disk is loaded from host
    index.apply("a", batch(3, moved("host", 4)))
    assert index.match_tiers("decode", [1, 2, 3, 4]) == {"a": TierHit(2, 2, 0)}


def test_the_engine_does_not_return_to_the_device_after_a_lower_tier_block() -> None:
    index = registered(("a", "decode"))
    index.apply("a", batch(0, stored(1, 3), moved("host", 2)))
    # 1 on device, 2 in host, 3 on device only: the engine's lower-tier walk stops at 3
    assert index.match_tiers("decode", [1, 2, 3]) == {"a": TierHit(1, 1, 0)}
    # a prompt starting in a lower tier is a whole lower-tier hit
    assert index.match_tiers("decode", [2]) == {"a": TierHit(0, 1, 0)}


def test_clearing_the_device_pool_keeps_the_lower_tiers() -> None:
    index = registered(("a", "prefill"))
    index.apply("a", batch(0, stored(1, 2), moved("disk", 1, 2)))
    index.apply("a", batch(1, AllBlocksCleared()))
    assert index.match_tiers("prefill", [1, 2]) == {"a": TierHit(0, 0, 2)}
    index.apply("a", batch(2, BlockRemoved(block_hashes=[1, 2], medium="disk")))
    assert index.match("prefill", [1, 2]) == {}
    assert index.stats().num_entries == 0 and index.stats().num_hashes == 0


def test_resync_installs_every_tier_and_degrading_drops_them() -> None:
    index = KVIndex()
    index.resync("a", [1], 0, pool="decode", tiers={"host": [2], "disk": [3]})
    assert index.match_tiers("decode", [1, 2, 3]) == {"a": TierHit(1, 1, 1)}
    index.mark_degraded("a")
    assert index.match("decode", [1, 2, 3]) == {}
    assert index.stats().num_entries == 0


@pytest.mark.parametrize("seed", range(5))
def test_match_tiers_agrees_with_the_engine_walk(seed: int) -> None:
    rng = random.Random(seed)
    index = KVIndex()
    held: dict[str, dict[str, set[int]]] = {}
    for r in range(6):
        media: dict[str, set[int]] = {m: set() for m in ("device", "host", "disk")}
        for h in range(10):
            for hashes in media.values():
                if rng.random() < 0.6:
                    hashes.add(h)
        held[f"r{r}"] = media
        index.resync(
            f"r{r}",
            media["device"],
            0,
            pool="decode",
            tiers={"host": sorted(media["host"]), "disk": sorted(media["disk"])},
        )
    prompt = list(range(10))
    expected = {}
    for replica_id, media in held.items():
        hit = engine_walk(media, prompt)
        if sum(hit):
            expected[replica_id] = TierHit(*hit)
    assert index.match_tiers("decode", prompt) == expected
