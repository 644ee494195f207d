"""The routing policies: ``round_robin``, ``least_loaded`` and ``prefix_aware``.

:func:`choose_prefix_aware` is a pure function of its :class:`RoutingInputs`:

1. every candidate gets ``cost = w.uncached_block * uncached prompt blocks + load`` where load
   is active tokens (in blocks), requests and KV usage (:func:`load_cost`), plus ``w.no_room``
   when its free blocks cannot hold the part not on its device; a prefix block held in the
   candidate's host or disk tier counts as a fraction of an uncached one, the tier's measured
   load-to-recompute ratio (:func:`lower_tier_cost`); candidates are ranked by cost, ties
   rotated by ``tie_break`` so fresh prefixes spread over the pool;
2. **session affinity**: a live pin moves its replica to the front unless it is overloaded
   (then the pin yields and the router re-pins to the new choice);
3. **hot-spot protection**: the replica with the most cached blocks is ranked last while it is
   overloaded and another candidate is idle;
4. cache hits of degraded replicas count as zero; with no usable index the decision is by load
   (reason ``degraded_index``).

Prefill and decode run the same function with different :class:`CostWeights` (see
``CostWeights.for_role``). The classes wrap the functions behind the ``RoutingPolicy`` protocol.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from cluster.routing.kv_index.holders import TierHit
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    ReplicaLoad,
    RoutingDecision,
    RoutingInputs,
    RoutingReason,
)


def load_cost(load: ReplicaLoad, weights: CostWeights, block_size: int) -> float:
    """The load part of the cost, in block-of-prefill units."""
    return (
        weights.active_block * load.num_active_tokens / max(block_size, 1)
        + weights.request * load.num_requests
        + weights.kv_usage * load.kv_usage
    )


def usable_hits(inputs: RoutingInputs) -> dict[str, int]:
    """Cache hits the policy may trust: none without an index, none for degraded replicas."""
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
    """Candidates in order starting at ``tie_break`` (the caller's counter)."""
    ranked = [c.replica_id for c in _rotated(inputs)]
    return _decision(inputs, ranked, RoutingReason.ROUND_ROBIN, usable_hits(inputs))


def choose_least_loaded(inputs: RoutingInputs, weights: CostWeights) -> RoutingDecision:
    """Candidates by :func:`load_cost` (cache ignored), ties rotated."""
    rotated = _rotated(inputs)
    order = sorted(
        range(len(rotated)), key=lambda i: (load_cost(rotated[i], weights, inputs.block_size), i)
    )
    ranked = [rotated[i].replica_id for i in order]
    return _decision(inputs, ranked, RoutingReason.LEAST_LOADED, usable_hits(inputs))


def choose_prefix_aware(
    inputs: RoutingInputs, weights: CostWeights, hot_spot: HotSpotConfig
) -> RoutingDecision:
    """Cache affinity against load; see the module docstring for the rules."""
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
        and not hot_spot.is_overloaded(by_id[pin.replica_id])
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
    """Host and disk hits in uncached-block units: each costs its tier's measured load time
    over recompute time (the prior until the replica has measured it)."""
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
    """The best cache holder when it is overloaded while another candidate is idle."""
    if len(candidates) < 2:
        return None
    best = max(candidates, key=lambda c: hits.get(c.replica_id, 0))
    if hits.get(best.replica_id, 0) == 0 or not hot_spot.is_overloaded(best):
        return None
    if any(hot_spot.is_idle(c) for c in candidates if c is not best):
        return best.replica_id
    return None


def _plain_reason(inputs: RoutingInputs, hits: dict[str, int], chosen: str) -> RoutingReason:
    all_degraded = all(c.replica_id in inputs.degraded_replica_ids for c in inputs.candidates)
    if not inputs.index_available or all_degraded:
        return RoutingReason.DEGRADED_INDEX
    return RoutingReason.CACHE_HIT if hits.get(chosen, 0) > 0 else RoutingReason.LEAST_LOADED


@dataclass
class RoundRobinPolicy:
    """``round_robin``: the baseline; ignores cache and load."""

    name: str = "round_robin"
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def choose(self, inputs: RoutingInputs) -> RoutingDecision:
        """Rank the candidates starting one further than last time."""
        rotated = dataclasses.replace(inputs, tie_break=next(self._counter))
        return choose_round_robin(rotated)


@dataclass(frozen=True)
class LeastLoadedPolicy:
    """``least_loaded``: lowest load cost, cache ignored."""

    weights: CostWeights | None = None
    name: str = "least_loaded"

    def choose(self, inputs: RoutingInputs) -> RoutingDecision:
        """Rank by load only."""
        return choose_least_loaded(inputs, self.weights or CostWeights.for_role(inputs.role))


@dataclass(frozen=True)
class PrefixAwarePolicy:
    """``prefix_aware``: cached prefix against load, with hot-spot and session rules."""

    weights: CostWeights | None = None
    hot_spot: HotSpotConfig = field(default_factory=HotSpotConfig)
    name: str = "prefix_aware"

    def choose(self, inputs: RoutingInputs) -> RoutingDecision:
        """Rank by :func:`choose_prefix_aware`."""
        weights = self.weights or CostWeights.for_role(inputs.role)
        return choose_prefix_aware(inputs, weights, self.hot_spot)
