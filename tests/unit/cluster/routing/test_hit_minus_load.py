"""The hot_prefix policy's score: queue plus uncached prefill, both in seconds."""

from __future__ import annotations

import pytest

from cluster.routing.hit_minus_load import (
    HotPrefixPolicy,
    choose_hit_minus_load,
    score_candidates,
)
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.policy_registry import make_policy
from cluster.routing.policy_types import (
    PoolRole,
    ReplicaLoad,
    RoutingInputs,
    RoutingReason,
    SessionPin,
)
from core.config import HotPrefixConfig

BLOCK_SIZE = 16
HASHES = tuple(range(100, 108))  # an 8-block prompt
NUM_PROMPT_TOKENS = len(HASHES) * BLOCK_SIZE  # 128
CONFIG = HotPrefixConfig(prefill_tokens_per_s=1000.0, ttft_target_s=0.5, no_room_s=60.0)


def inputs(*candidates: ReplicaLoad, **overrides: object) -> RoutingInputs:
    values: dict[str, object] = {
        "role": PoolRole.DECODE,
        "candidates": candidates,
        "block_hashes": HASHES,
        "block_size": BLOCK_SIZE,
        "num_prompt_tokens": NUM_PROMPT_TOKENS,
        "now_s": 1000.0,
    }
    values.update(overrides)
    return RoutingInputs(**values)  # type: ignore[arg-type]


def test_cost_is_queue_plus_uncached_prefill_in_seconds() -> None:
    a = ReplicaLoad("a", num_active_tokens=200)
    b = ReplicaLoad("b", num_pending_prompt_tokens=300, prefill_tokens_per_s=2000.0)
    scores = score_candidates(inputs(a, b, cache_hits={"a": 6}), CONFIG)
    assert [(s.replica_id, s.num_hit_blocks) for s in scores] == [("a", 6), ("b", 0)]
    assert scores[0].queue_s == pytest.approx(0.2)
    assert scores[0].prefill_s == pytest.approx((128 - 96) / 1000)  # 2 uncached blocks
    assert scores[1].queue_s == pytest.approx(0.15)  # reported queue at its measured rate
    assert scores[1].prefill_s == pytest.approx(128 / 2000)
    assert scores[0].cost_s == pytest.approx(0.232)


def test_a_hit_wins_until_its_queue_costs_more_than_it_saves() -> None:
    holder, idle = ReplicaLoad("a", num_active_tokens=50), ReplicaLoad("b")
    near = choose_hit_minus_load(inputs(holder, idle, cache_hits={"a": 8}), CONFIG)[0]
    assert (near.replica_id, near.reason, near.num_cached_blocks) == ("a", "cache_hit", 8)
    busy = ReplicaLoad("a", num_active_tokens=129)  # queue 0.129 s > the 0.128 s it saves
    far = choose_hit_minus_load(inputs(busy, idle, cache_hits={"a": 8}), CONFIG)[0]
    assert (far.replica_id, far.reason) == ("b", RoutingReason.LEAST_LOADED)
    assert far.ranked_replica_ids == ("b", "a")


def test_equal_costs_rotate_with_tie_break() -> None:
    loads = (ReplicaLoad("a"), ReplicaLoad("b"), ReplicaLoad("c"))
    chosen = [
        choose_hit_minus_load(inputs(*loads, tie_break=i), CONFIG)[0].replica_id for i in range(3)
    ]
    assert chosen == ["a", "b", "c"]


def test_host_hits_count_at_their_load_ratio_and_take_room() -> None:
    # 8 blocks hit, 4 of them on host at ratio 0.25: saves 7 blocks of prefill
    a = ReplicaLoad("a", num_free_blocks=3, host_block_cost=0.25)
    score = score_candidates(
        inputs(a, cache_hits={"a": 8}, tier_hits={"a": TierHit(4, 4, 0)}), CONFIG
    )[0]
    assert score.prefill_s == pytest.approx(16 / 1000)
    assert score.no_room_s == 60.0  # the 4 host blocks need device room: only 3 free


def test_degraded_replicas_hits_count_as_zero() -> None:
    a = ReplicaLoad("a")
    scores = score_candidates(
        inputs(a, cache_hits={"a": 8}, degraded_replica_ids=frozenset({"a"})), CONFIG
    )
    assert scores[0].num_hit_blocks == 0
    decision = choose_hit_minus_load(inputs(a, cache_hits={"a": 8}, index_available=False), CONFIG)[
        0
    ]
    assert decision.reason is RoutingReason.DEGRADED_INDEX


def test_session_pin_holds_until_its_queue_passes_the_target() -> None:
    pin = SessionPin("b", expires_at_s=2000.0)
    a, b = ReplicaLoad("a"), ReplicaLoad("b", num_active_tokens=400)
    kept = choose_hit_minus_load(inputs(a, b, session_pin=pin), CONFIG)[0]
    assert (kept.replica_id, kept.reason) == ("b", RoutingReason.SESSION_AFFINITY)
    swamped = ReplicaLoad("b", num_active_tokens=600)  # 0.6 s queue > 0.5 s target
    left = choose_hit_minus_load(inputs(a, swamped, session_pin=pin), CONFIG)[0]
    assert left.replica_id == "a"
    expired = SessionPin("b", expires_at_s=10.0)
    assert choose_hit_minus_load(inputs(a, b, session_pin=expired), CONFIG)[0].replica_id == "a"


def test_policy_from_the_registry_uses_its_config() -> None:
    policy = make_policy("hot_prefix", hot_prefixes=CONFIG)
    assert policy == HotPrefixPolicy(CONFIG)
    assert make_policy("hot_prefix") == HotPrefixPolicy(HotPrefixConfig())
    with pytest.raises(ValueError, match="at least one candidate"):
        policy.choose(inputs())
