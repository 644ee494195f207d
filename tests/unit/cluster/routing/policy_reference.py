"""A frozen copy of the straightforward routing policies, kept only as a test oracle.

``cluster/routing/policies.py`` was tuned for pools of a thousand candidates (one pass over the
candidates, hits looked up only where the index has them); this is the plain version it
replaced, copied as it stood (commit edcd3ce), so ``test_policy_equivalence.py`` can check that
every decision is still the same. The ``ReplicaLoad`` and ``HotSpotConfig`` rules the policy
read through properties (``kv_usage``, ``num_requests``, ``is_overloaded``, ``is_idle``) are
copied here as functions, so a later change to ``policy_types.py`` cannot move the oracle too.

Do not optimise or "fix" this module: a change of behaviour belongs in ``policies.py`` and in a
test that says what changed, not here.
"""

from __future__ import annotations

from cluster.routing.kv_index.holders import TierHit
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    ReplicaLoad,
    RoutingDecision,
    RoutingInputs,
    RoutingReason,
)


def kv_usage(load: ReplicaLoad) -> float:
    if load.num_free_blocks is None:
        return 0.0
    total = load.num_used_blocks + load.num_free_blocks
    return load.num_used_blocks / total if total > 0 else 0.0


def num_requests(load: ReplicaLoad) -> int:
    return load.num_running_requests + load.num_queued_requests


def is_overloaded(hot_spot: HotSpotConfig, load: ReplicaLoad) -> bool:
    return (
        num_requests(load) >= hot_spot.overload_requests
        or kv_usage(load) >= hot_spot.overload_kv_usage
    )


def is_idle(hot_spot: HotSpotConfig, load: ReplicaLoad) -> bool:
    return num_requests(load) <= hot_spot.idle_requests and load.num_active_tokens == 0


def load_cost(load: ReplicaLoad, weights: CostWeights, block_size: int) -> float:
    return (
        weights.active_block * load.num_active_tokens / max(block_size, 1)
        + weights.request * num_requests(load)
        + weights.kv_usage * kv_usage(load)
    )


def usable_hits(inputs: RoutingInputs) -> dict[str, int]:
    if not inputs.index_available:
        return {}
    return {
        c.replica_id: min(inputs.cache_hits.get(c.replica_id, 0), inputs.num_prompt_blocks)
        for c in inputs.candidates
        if c.replica_id not in inputs.degraded_replica_ids
    }


def _rotated(inputs: RoutingInputs) -> list[ReplicaLoad]:
    candidates = list(inputs.candidates)
    if not candidates:
        raise ValueError("a routing decision needs at least one candidate replica")
    start = inputs.tie_break % len(candidates)
    return candidates[start:] + candidates[:start]


def _decision(
    inputs: RoutingInputs, ranked: list[str], reason: RoutingReason, hits: dict[str, int]
) -> RoutingDecision:
    return RoutingDecision(
        replica_id=ranked[0],
        reason=reason,
        ranked_replica_ids=tuple(ranked),
        num_cached_blocks=hits.get(ranked[0], 0),
        num_prompt_blocks=inputs.num_prompt_blocks,
    )


def choose_round_robin(inputs: RoutingInputs) -> RoutingDecision:
    ranked = [c.replica_id for c in _rotated(inputs)]
    return _decision(inputs, ranked, RoutingReason.ROUND_ROBIN, usable_hits(inputs))


def choose_least_loaded(inputs: RoutingInputs, weights: CostWeights) -> RoutingDecision:
    rotated = _rotated(inputs)
    order = sorted(
        range(len(rotated)), key=lambda i: (load_cost(rotated[i], weights, inputs.block_size), i)
    )
    ranked = [rotated[i].replica_id for i in order]
    return _decision(inputs, ranked, RoutingReason.LEAST_LOADED, usable_hits(inputs))


def choose_prefix_aware(
    inputs: RoutingInputs, weights: CostWeights, hot_spot: HotSpotConfig
) -> RoutingDecision:
    rotated = _rotated(inputs)
    hits = usable_hits(inputs)
    costs = [_total_cost(c, hits.get(c.replica_id, 0), inputs, weights) for c in rotated]
    ranked = [rotated[i].replica_id for i in sorted(range(len(rotated)), key=lambda i: costs[i])]
    by_id = {c.replica_id: c for c in rotated}
    pin = inputs.session_pin
    if (
        pin is not None
        and inputs.now_s < pin.expires_at_s
        and pin.replica_id in by_id
        and not is_overloaded(hot_spot, by_id[pin.replica_id])
    ):
        ranked.remove(pin.replica_id)
        return _decision(inputs, [pin.replica_id, *ranked], RoutingReason.SESSION_AFFINITY, hits)
    hot = _hot_spot(rotated, hits, hot_spot)
    if hot is not None:
        was_first = ranked[0] == hot
        ranked.remove(hot)
        ranked.append(hot)
        if was_first:
            return _decision(inputs, ranked, RoutingReason.HOT_SPOT_AVOIDED, hits)
    return _decision(inputs, ranked, _plain_reason(inputs, hits, ranked[0]), hits)


def lower_tier_cost(load: ReplicaLoad, hit: TierHit, weights: CostWeights) -> float:
    host = weights.host_block_prior if load.host_block_cost is None else load.host_block_cost
    disk = weights.disk_block_prior if load.disk_block_cost is None else load.disk_block_cost
    return hit.num_host * host + hit.num_disk * disk


def _total_cost(
    load: ReplicaLoad, num_hit_blocks: int, inputs: RoutingInputs, weights: CostWeights
) -> float:
    num_uncached: float = inputs.num_prompt_blocks - num_hit_blocks
    num_on_device = num_hit_blocks
    tier_hit = inputs.tier_hits.get(load.replica_id)
    if num_hit_blocks and tier_hit is not None:
        num_uncached += lower_tier_cost(load, tier_hit, weights)
        num_on_device = max(0, num_hit_blocks - tier_hit.num_host - tier_hit.num_disk)
    cost = weights.uncached_block * num_uncached + load_cost(load, weights, inputs.block_size)
    num_needed = -(-max(inputs.num_prompt_tokens, 1) // max(inputs.block_size, 1))
    if load.num_free_blocks is not None and load.num_free_blocks < num_needed - num_on_device:
        cost += weights.no_room
    return cost


def _hot_spot(
    candidates: list[ReplicaLoad], hits: dict[str, int], hot_spot: HotSpotConfig
) -> str | None:
    if len(candidates) < 2:
        return None
    best = max(candidates, key=lambda c: hits.get(c.replica_id, 0))
    if hits.get(best.replica_id, 0) == 0 or not is_overloaded(hot_spot, best):
        return None
    if any(is_idle(hot_spot, c) for c in candidates if c is not best):
        return best.replica_id
    return None


def _plain_reason(inputs: RoutingInputs, hits: dict[str, int], chosen: str) -> RoutingReason:
    all_degraded = all(c.replica_id in inputs.degraded_replica_ids for c in inputs.candidates)
    if not inputs.index_available or all_degraded:
        return RoutingReason.DEGRADED_INDEX
    return RoutingReason.CACHE_HIT if hits.get(chosen, 0) > 0 else RoutingReason.LEAST_LOADED
