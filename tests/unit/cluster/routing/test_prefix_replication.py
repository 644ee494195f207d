"""Deliberate copies of hot prefixes: when, where, from whom, the bounds, and retirement."""

from __future__ import annotations

import pytest

from cluster.routing.hit_minus_load import CandidateSeconds
from cluster.routing.hot_prefixes import HotPrefixes
from cluster.routing.policy_types import PoolRole, ReplicaLoad, RoutingInputs
from cluster.routing.prefix_heat import HeatReading, PrefixHeat
from cluster.routing.prefix_replication import CopyCounters, PrefixReplicator
from core.config import HotPrefixConfig
from core.errors import MessageError
from core.messages import WarmPrefixRequest

HASHES = (11, 12, 13, 14)
BLOCK_BYTES = 1000
CONFIG = HotPrefixConfig(
    ttft_target_s=0.5,
    min_copy_rate_per_s=2.0,
    retire_rate_per_s=1.0,
    max_copies_per_prefix=2,
    copy_bytes_per_interval=10_000,
    copy_interval_s=10.0,
)
HOT = HeatReading(head=11, rate_per_s=5.0, tokens_per_s=500.0, num_queued_tokens=0)


def seconds(replica_id: str, hit: int, queue_s: float, prefill_s: float = 0.1) -> CandidateSeconds:
    return CandidateSeconds(replica_id, hit, queue_s, prefill_s, no_room_s=0.0)


SLOW_HOLDER = [seconds("a", 4, 2.0), seconds("b", 0, 0.3, 0.9), seconds("c", 0, 0.1, 0.9)]


def test_copies_a_hot_prefix_from_its_slow_holder_to_the_least_loaded() -> None:
    replicator = PrefixReplicator(CONFIG, pool="decode")
    warm = replicator.consider(HOT, HASHES, SLOW_HOLDER, now_s=0.0, block_bytes=BLOCK_BYTES)
    assert warm == WarmPrefixRequest(
        pool="decode",
        prefix_head=11,
        block_hashes=HASHES,
        source_replica_id="a",
        target_replica_id="c",
        num_bytes=4000,
    )
    assert replicator.copies_of(11) == {"c"}
    assert replicator.counters() == CopyCounters(1, 1, 0, 4000)


@pytest.mark.parametrize(
    ("reading", "scores"),
    [
        (HeatReading(11, 1.5, 0.0, 0), SLOW_HOLDER),  # not hot enough
        (HOT, [seconds("a", 4, 0.3), seconds("c", 0, 0.0)]),  # holder within the target
        (HOT, [seconds("a", 0, 2.0), seconds("c", 0, 0.0)]),  # nobody holds it
        (HOT, [seconds("a", 4, 2.0)]),  # nobody to copy to
        (HOT, [seconds("a", 4, 0.6), seconds("c", 0, 0.6)]),  # a copy would not be sooner
    ],
)
def test_no_copy_when_a_rule_does_not_hold(
    reading: HeatReading, scores: list[CandidateSeconds]
) -> None:
    replicator = PrefixReplicator(CONFIG, pool="decode")
    assert replicator.consider(reading, HASHES, scores, 0.0, BLOCK_BYTES) is None
    assert replicator.counters() == CopyCounters(0, 0, 0, 0)


def test_no_copy_to_a_replica_without_room() -> None:
    full = CandidateSeconds("c", 0, 0.0, 0.9, no_room_s=60.0)
    replicator = PrefixReplicator(CONFIG, pool="decode")
    assert replicator.consider(HOT, HASHES, [seconds("a", 4, 2.0), full], 0.0, BLOCK_BYTES) is None


def test_one_copy_lands_before_the_next_and_copies_are_capped() -> None:
    replicator = PrefixReplicator(CONFIG, pool="decode")
    first = replicator.consider(HOT, HASHES, SLOW_HOLDER, 0.0, BLOCK_BYTES)
    assert first is not None and first.target_replica_id == "c"
    assert replicator.consider(HOT, HASHES, SLOW_HOLDER, 1.0, BLOCK_BYTES) is None  # landing
    landed = [seconds("a", 4, 2.0), seconds("b", 0, 0.3, 0.9), seconds("c", 4, 1.0)]
    second = replicator.consider(HOT, HASHES, landed, 2.0, BLOCK_BYTES)
    assert second is not None and second.target_replica_id == "b"
    both = [seconds("a", 4, 2.0), seconds("b", 4, 2.0), seconds("c", 4, 1.0), seconds("d", 0, 0)]
    assert replicator.consider(HOT, HASHES, both, 3.0, BLOCK_BYTES) is None  # max 2 copies
    assert replicator.copies_of(11) == {"b", "c"}


def test_a_copy_that_never_lands_is_given_up() -> None:
    replicator = PrefixReplicator(CONFIG, pool="decode")
    assert replicator.consider(HOT, HASHES, SLOW_HOLDER, 0.0, BLOCK_BYTES) is not None
    retry = replicator.consider(HOT, HASHES, SLOW_HOLDER, 10.5, BLOCK_BYTES)
    assert retry is not None and retry.target_replica_id == "c"
    assert replicator.counters() == CopyCounters(1, 2, 1, 8000)


def test_bytes_budget_per_interval() -> None:
    config = CONFIG.model_copy(update={"copy_bytes_per_interval": 5000})
    replicator = PrefixReplicator(config, pool="decode")
    assert replicator.consider(HOT, HASHES, SLOW_HOLDER, 0.0, BLOCK_BYTES) is not None
    other = HeatReading(21, 5.0, 0.0, 0)
    assert replicator.consider(other, (21, 22), SLOW_HOLDER, 1.0, BLOCK_BYTES) is None  # 6000
    assert replicator.consider(other, (21, 22), SLOW_HOLDER, 10.0, BLOCK_BYTES) is not None


def test_copies_retire_when_heat_falls_and_with_their_replica() -> None:
    heat = PrefixHeat(half_life_s=1.0, max_prefixes=8)
    for i in range(10):
        heat.record(f"r{i}", 11, 10, now_s=0.0)
    replicator = PrefixReplicator(CONFIG, pool="decode")
    assert replicator.consider(heat.reading(11, 0.0), HASHES, SLOW_HOLDER, 0.0, BLOCK_BYTES)
    assert replicator.retire(heat, now_s=1.0) == 0  # 10 ln2 / 2 = 3.5 per s: still hot
    assert replicator.retire(heat, now_s=4.0) == 1  # 0.43 per s
    assert replicator.copies_of(11) == frozenset()
    assert replicator.counters() == CopyCounters(0, 1, 1, 4000)
    replicator.consider(HOT, HASHES, SLOW_HOLDER, 5.0, BLOCK_BYTES)
    replicator.forget_replica("c")
    assert replicator.counters() == CopyCounters(0, 2, 2, 8000)


def test_hot_prefixes_feeds_heat_and_queues_the_copy() -> None:
    update = {"prefill_tokens_per_s": 1000.0, "heat_half_life_s": 1.0, "min_copy_rate_per_s": 25.0}
    config = CONFIG.model_copy(update=update)
    hot = HotPrefixes(config, pool="decode")
    holder = ReplicaLoad("a", num_active_tokens=3000)  # 3 s queue
    idle = ReplicaLoad("b")
    routed = RoutingInputs(
        role=PoolRole.DECODE,
        candidates=(holder, idle),
        block_hashes=HASHES,
        block_size=16,
        num_prompt_tokens=64,
        cache_hits={"a": 4},
    )
    warm = None
    for i in range(3):  # each request at once reads as ~10.3 per s: the third makes it hot
        assert warm is None
        warm = hot.placed(f"r{i}", routed, 64, now_s=0.0, block_bytes=BLOCK_BYTES)
    assert warm is not None and (warm.source_replica_id, warm.target_replica_id) == ("a", "b")
    assert hot.take_warm_requests() == [warm]
    assert hot.take_warm_requests() == []
    assert hot.heat.reading(11, 0.0).num_queued_tokens == 192
    hot.finished("r0")
    assert hot.heat.reading(11, 0.0).num_queued_tokens == 128
    hot.forget_replica("b")
    assert hot.counters() == CopyCounters(0, 1, 1, 4000)


def test_warm_prefix_request_validates() -> None:
    with pytest.raises(MessageError, match="block hash"):
        WarmPrefixRequest("decode", 1, (), "a", "b")
    with pytest.raises(MessageError, match="itself"):
        WarmPrefixRequest("decode", 1, (1,), "a", "a")


def test_config_refuses_retiring_above_the_copy_rate() -> None:
    with pytest.raises(ValueError, match="retire_rate_per_s"):
        HotPrefixConfig(min_copy_rate_per_s=1.0, retire_rate_per_s=2.0)


def test_demand_beyond_the_holders_copies_before_their_queue_shows_it() -> None:
    # each holder serves a hit in 0.1 s; 25 requests per second need 2.5 holders' time
    quiet = [seconds("a", 4, 0.0), seconds("b", 4, 0.0), seconds("c", 0, 0.0)]
    busy = HeatReading(11, 25.0, 0.0, 0)
    replicator = PrefixReplicator(CONFIG, pool="decode")
    warm = replicator.consider(busy, HASHES, quiet, 0.0, BLOCK_BYTES)
    assert warm is not None and warm.target_replica_id == "c"
    # 8 per second over two holders: rho 0.4, wait 0.1 + 0.033 s, within the 0.5 s target
    calm = HeatReading(11, 8.0, 0.0, 0)
    assert PrefixReplicator(CONFIG, pool="decode").consider(calm, HASHES, quiet, 0.0, 1) is None
