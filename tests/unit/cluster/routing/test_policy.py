"""Routing policies on scripted states: cache affinity, load fallback, hot spots, sessions,
degraded index, decode-pool preferences, round-robin fairness, the registry."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from cluster.routing.kv_index.holders import TierHit
from cluster.routing.policies import (
    LeastLoadedPolicy,
    PrefixAwarePolicy,
    RoundRobinPolicy,
    choose_prefix_aware,
)
from cluster.routing.policy_registry import (
    BUILTIN_POLICY_NAMES,
    make_policy,
    policy_names,
    register_policy,
)
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    PoolRole,
    ReplicaLoad,
    RoutingDecision,
    RoutingInputs,
    RoutingReason,
    SessionPin,
)
from core.errors import ConfigError

BLOCK_SIZE = 16
HASHES = tuple(range(100, 108))  # an 8-block prompt


def inputs(
    *candidates: ReplicaLoad,
    hits: dict[str, int] | None = None,
    role: PoolRole = PoolRole.PREFILL,
    **overrides: object,
) -> RoutingInputs:
    values: dict[str, object] = {
        "role": role,
        "candidates": candidates,
        "block_hashes": HASHES,
        "block_size": BLOCK_SIZE,
        "num_prompt_tokens": len(HASHES) * BLOCK_SIZE + 5,
        "cache_hits": hits or {},
        "now_s": 1000.0,
    }
    values.update(overrides)
    return RoutingInputs(**values)  # type: ignore[arg-type]


def prefix_aware(routing_inputs: RoutingInputs) -> RoutingDecision:
    return PrefixAwarePolicy().choose(routing_inputs)


IDLE_A, IDLE_B, IDLE_C = ReplicaLoad("a"), ReplicaLoad("b"), ReplicaLoad("c")
OVERLOADED_A = ReplicaLoad("a", num_running_requests=6, num_queued_requests=4)


def test_prefill_prefers_the_replica_caching_the_longest_prefix() -> None:
    decision = prefix_aware(inputs(IDLE_A, IDLE_B, IDLE_C, hits={"b": 6, "c": 2}))
    assert decision.replica_id == "b"
    assert decision.reason is RoutingReason.CACHE_HIT
    assert decision.ranked_replica_ids == ("b", "c", "a")
    assert (decision.num_cached_blocks, decision.num_prompt_blocks) == (6, 8)


def test_cache_yields_when_its_load_costs_more_than_recomputing() -> None:
    busy_b = ReplicaLoad("b", num_active_tokens=20 * BLOCK_SIZE, num_running_requests=2)
    decision = prefix_aware(inputs(IDLE_A, busy_b, hits={"b": 6}))
    assert decision.replica_id == "a"
    assert decision.reason is RoutingReason.LEAST_LOADED
    # a lightly loaded holder still wins: 2 uncached blocks + a little load < 8 blocks
    light_b = ReplicaLoad("b", num_active_tokens=2 * BLOCK_SIZE, num_running_requests=1)
    assert prefix_aware(inputs(IDLE_A, light_b, hits={"b": 6})).replica_id == "b"


def test_hot_spot_protection_needs_an_overloaded_holder_and_an_idle_peer() -> None:
    # the cost alone would pick the overloaded holder (8 cached blocks outweigh its queue)
    weights = CostWeights(request=0.5)
    policy = PrefixAwarePolicy(weights=weights)
    decision = policy.choose(inputs(OVERLOADED_A, IDLE_B, hits={"a": 8}))
    assert decision.replica_id == "b"
    assert decision.reason is RoutingReason.HOT_SPOT_AVOIDED
    assert decision.ranked_replica_ids == ("b", "a")
    # no idle peer: the holder keeps the request
    busy_b = ReplicaLoad("b", num_running_requests=3)
    decision = policy.choose(inputs(OVERLOADED_A, busy_b, hits={"a": 8}))
    assert (decision.replica_id, decision.reason) == ("a", RoutingReason.CACHE_HIT)
    # not overloaded (below the threshold): the holder keeps it too
    loaded_a = ReplicaLoad("a", num_running_requests=7)
    decision = policy.choose(inputs(loaded_a, IDLE_B, hits={"a": 8}))
    assert decision.replica_id == "a"


def test_hot_spot_by_kv_usage() -> None:
    full_a = ReplicaLoad("a", num_used_blocks=97, num_free_blocks=3)
    decision = choose_prefix_aware(
        inputs(full_a, IDLE_B, hits={"a": 8}), CostWeights(kv_usage=0.0), HotSpotConfig()
    )
    assert decision.reason is RoutingReason.HOT_SPOT_AVOIDED


def test_a_holder_idle_but_full_is_not_its_own_idle_peer() -> None:
    full_idle_a = ReplicaLoad("a", num_used_blocks=97, num_free_blocks=3)
    busy_b = ReplicaLoad("b", num_active_tokens=BLOCK_SIZE, num_running_requests=1)
    decision = choose_prefix_aware(
        inputs(full_idle_a, busy_b, hits={"a": 8}), CostWeights(kv_usage=0.0), HotSpotConfig()
    )
    assert (decision.replica_id, decision.reason) == ("a", RoutingReason.CACHE_HIT)


def test_session_affinity_holds_until_the_ttl() -> None:
    pin = SessionPin("c", expires_at_s=1500.0)
    decision = prefix_aware(inputs(IDLE_A, IDLE_B, IDLE_C, hits={"a": 8}, session_pin=pin))
    assert decision.replica_id == "c"
    assert decision.reason is RoutingReason.SESSION_AFFINITY
    assert decision.ranked_replica_ids == ("c", "a", "b")
    expired = prefix_aware(
        inputs(IDLE_A, IDLE_B, IDLE_C, hits={"a": 8}, session_pin=pin, now_s=1500.0)
    )
    assert (expired.replica_id, expired.reason) == ("a", RoutingReason.CACHE_HIT)


def test_session_affinity_yields_to_overload_and_to_a_missing_replica() -> None:
    pin_a = SessionPin("a", expires_at_s=2000.0)
    decision = prefix_aware(inputs(OVERLOADED_A, IDLE_B, hits={"a": 3}, session_pin=pin_a))
    assert decision.replica_id == "b"
    assert decision.reason is not RoutingReason.SESSION_AFFINITY
    gone = SessionPin("zzz", expires_at_s=2000.0)
    decision = prefix_aware(inputs(IDLE_A, IDLE_B, hits={"b": 2}, session_pin=gone))
    assert (decision.replica_id, decision.reason) == ("b", RoutingReason.CACHE_HIT)


def test_degraded_replicas_hits_are_ignored() -> None:
    decision = prefix_aware(
        inputs(
            ReplicaLoad("a", num_running_requests=1),
            IDLE_B,
            hits={"a": 8},
            degraded_replica_ids=frozenset({"a"}),
        )
    )
    assert decision.replica_id == "b"
    assert decision.reason is RoutingReason.LEAST_LOADED
    assert decision.num_cached_blocks == 0


def test_no_usable_index_routes_by_load_with_its_own_reason() -> None:
    busy_a = ReplicaLoad("a", num_running_requests=2)
    for routing_inputs in (
        inputs(busy_a, IDLE_B, hits={"a": 8}, index_available=False),
        inputs(busy_a, IDLE_B, hits={"a": 8}, degraded_replica_ids=frozenset({"a", "b"})),
    ):
        decision = prefix_aware(routing_inputs)
        assert (decision.replica_id, decision.reason) == ("b", RoutingReason.DEGRADED_INDEX)


def test_decode_prefers_free_kv_and_low_load_over_its_cached_prefix() -> None:
    crowded_a = ReplicaLoad("a", num_running_requests=2, num_used_blocks=80, num_free_blocks=20)
    roomy_b = ReplicaLoad("b", num_running_requests=2, num_used_blocks=10, num_free_blocks=90)
    decision = prefix_aware(inputs(crowded_a, roomy_b, hits={"a": 8}, role=PoolRole.DECODE))
    assert decision.replica_id == "b"
    # the same state in the prefill pool follows the cache
    assert prefix_aware(inputs(crowded_a, roomy_b, hits={"a": 8})).replica_id == "a"
    # with equal KV pressure, decode also takes its own cached prefix (fewer blocks to pull)
    twin_a = ReplicaLoad("a", num_used_blocks=10, num_free_blocks=90)
    decision = prefix_aware(inputs(twin_a, roomy_b, hits={"a": 4}, role=PoolRole.DECODE))
    assert (decision.replica_id, decision.reason) == ("a", RoutingReason.CACHE_HIT)


def test_a_replica_without_room_for_the_blocks_is_avoided() -> None:
    tight_a = ReplicaLoad("a", num_used_blocks=0, num_free_blocks=4)
    roomy_b = ReplicaLoad("b", num_running_requests=3, num_used_blocks=0, num_free_blocks=64)
    decision = prefix_aware(inputs(tight_a, roomy_b, role=PoolRole.DECODE))
    assert decision.replica_id == "b"
    # with 6 of the 9 needed blocks cached, 4 free blocks are enough
    assert prefix_aware(inputs(tight_a, roomy_b, hits={"a": 6})).replica_id == "a"


def test_equal_costs_rotate_so_fresh_prefixes_spread() -> None:
    firsts = {
        prefix_aware(inputs(IDLE_A, IDLE_B, IDLE_C, tie_break=i)).replica_id for i in range(3)
    }
    assert firsts == {"a", "b", "c"}


def test_round_robin_is_fair_and_ignores_cache_and_load() -> None:
    policy = RoundRobinPolicy()
    counts: Counter[str] = Counter()
    for _ in range(300):
        decision = policy.choose(inputs(OVERLOADED_A, IDLE_B, IDLE_C, hits={"a": 8}))
        assert decision.reason is RoutingReason.ROUND_ROBIN
        assert sorted(decision.ranked_replica_ids) == ["a", "b", "c"]
        counts[decision.replica_id] += 1
    assert counts == {"a": 100, "b": 100, "c": 100}


def test_least_loaded_ignores_cache() -> None:
    busy_a = ReplicaLoad("a", num_active_tokens=64, num_running_requests=1)
    decision = LeastLoadedPolicy().choose(inputs(busy_a, IDLE_B, hits={"a": 8}))
    assert (decision.replica_id, decision.reason) == ("b", RoutingReason.LEAST_LOADED)
    assert decision.ranked_replica_ids == ("b", "a")


@dataclass
class _Scripted:
    seed: int


@pytest.mark.parametrize("state", [_Scripted(s) for s in range(25)])
def test_every_policy_ranks_every_candidate_once(state: _Scripted) -> None:
    rng = random.Random(state.seed)
    candidates = [
        ReplicaLoad(
            f"r{i}",
            num_active_tokens=rng.randrange(0, 500),
            num_running_requests=rng.randrange(0, 12),
            num_queued_requests=rng.randrange(0, 4),
            num_used_blocks=rng.randrange(0, 100),
            num_free_blocks=rng.choice([None, rng.randrange(0, 100)]),
        )
        for i in range(rng.randrange(1, 6))
    ]
    hits = {c.replica_id: rng.randrange(0, 9) for c in candidates}
    pin = SessionPin(rng.choice(candidates).replica_id, expires_at_s=rng.uniform(900, 1100))
    routing_inputs = inputs(
        *candidates,
        hits=hits,
        session_pin=pin,
        role=rng.choice(list(PoolRole)),
        degraded_replica_ids=frozenset(c.replica_id for c in candidates if rng.random() < 0.2),
    )
    for name in BUILTIN_POLICY_NAMES:
        decision = make_policy(name).choose(routing_inputs)
        assert sorted(decision.ranked_replica_ids) == sorted(c.replica_id for c in candidates)
        assert decision.replica_id == decision.ranked_replica_ids[0]


def test_no_candidates_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one candidate"):
        prefix_aware(inputs())


def test_registry_names_and_errors() -> None:
    assert BUILTIN_POLICY_NAMES == ("round_robin", "least_loaded", "prefix_aware", "hot_prefix")
    assert isinstance(make_policy("prefix_aware"), PrefixAwarePolicy)
    with pytest.raises(ConfigError) as info:
        make_policy("random")
    assert info.value.param == "routing.policy"
    with pytest.raises(ValueError, match="already registered"):
        register_policy("round_robin", lambda weights, hot_spot: RoundRobinPolicy())
    name = "test_only_first_candidate"
    register_policy(name, lambda weights, hot_spot: RoundRobinPolicy(name=name))
    assert name in policy_names()
    assert make_policy(name).name == name


def tier_inputs(tier_hits: dict[str, TierHit], *candidates: ReplicaLoad) -> RoutingInputs:
    return inputs(
        *candidates,
        hits={rid: hit.num_blocks for rid, hit in tier_hits.items()},
        tier_hits=tier_hits,
    )


def test_a_host_hit_is_cheaper_than_recompute_and_dearer_than_the_device() -> None:
    a, b, c = ReplicaLoad("a"), ReplicaLoad("b"), ReplicaLoad("c")
    on_host = {"a": TierHit(0, 8, 0)}
    assert prefix_aware(tier_inputs(on_host, b, a)).replica_id == "a"
    both = {"a": TierHit(0, 8, 0), "c": TierHit(8, 0, 0)}
    assert prefix_aware(tier_inputs(both, a, c)).ranked_replica_ids == ("c", "a")
    # with the priors, 8 host blocks cost 1.6 uncached blocks and 8 disk blocks 4
    host_or_disk = {"a": TierHit(0, 8, 0), "b": TierHit(0, 0, 8)}
    assert prefix_aware(tier_inputs(host_or_disk, b, a)).ranked_replica_ids == ("a", "b")


def test_measured_tier_costs_replace_the_priors() -> None:
    slow_host = ReplicaLoad("a", host_block_cost=0.9)
    fast_disk = ReplicaLoad("b", disk_block_cost=0.05)
    hits = {"a": TierHit(0, 8, 0), "b": TierHit(0, 0, 8)}
    assert prefix_aware(tier_inputs(hits, slow_host, fast_disk)).replica_id == "b"
    # a measured cost near recompute makes a long host hit worth less than 2 device blocks
    short_device = {"a": TierHit(0, 8, 0), "b": TierHit(2, 0, 0)}
    assert prefix_aware(tier_inputs(short_device, slow_host, ReplicaLoad("b"))).replica_id == "b"


def test_lower_tier_hits_need_free_device_blocks() -> None:
    full = ReplicaLoad("a", num_used_blocks=30, num_free_blocks=2)  # under the hot-spot line
    roomy = ReplicaLoad("b", num_used_blocks=0, num_free_blocks=100)
    # a device hit needs only the tail (1 block): fits in a; a host hit needs all 9: it does not
    assert prefix_aware(tier_inputs({"a": TierHit(8, 0, 0)}, full, roomy)).replica_id == "a"
    assert prefix_aware(tier_inputs({"a": TierHit(0, 8, 0)}, full, roomy)).replica_id == "b"
