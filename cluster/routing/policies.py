"""The routing policies: ``round_robin``, ``least_loaded`` and ``prefix_aware``.

:func:`choose_prefix_aware` is a pure function of its :class:`RoutingInputs`:

1. every candidate gets ``cost = w.uncached_block * uncached prompt blocks + load`` where load
   is active tokens (in blocks), requests and KV usage (:func:`load_cost`), plus ``w.no_room``
   when its free blocks cannot hold the part not on its device; a prefix block held in the
   candidate's host or disk tier counts as a fraction of an uncached one, the tier's measured
   load-to-recompute ratio (:func:`lower_tier_cost`); a request naming a LoRA adapter adds
   where the adapter is (``cluster.routing.adapter_affinity``); candidates are ranked by cost, ties
   rotated by ``tie_break`` so fresh prefixes spread over the pool;
2. **session affinity**: a live pin moves its replica to the front unless it is overloaded
   (then the pin yields and the router re-pins to the new choice);
3. **hot-spot protection**: the replica with the most cached blocks is ranked last while it is
   overloaded and another candidate is idle;
4. cache hits of degraded replicas count as zero; with no usable index the decision is by load
   (reason ``degraded_index``).

Prefill and decode run the same function with different :class:`CostWeights` (see
``CostWeights.for_role``). The classes wrap the functions behind the ``RoutingPolicy`` protocol.

A decision must stay well under a millisecond at a thousand candidates, so the pool is walked
once, in one loop that inlines the load terms and reads the per-decision constants once;
everything else walks the index's answer (the few cache holders) instead of the pool. The
plain version of these rules is kept in ``tests/unit/cluster/routing/policy_reference.py``,
and every decision, and every cost to the bit, must equal it.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from cluster.routing.adapter_affinity import with_adapter_costs
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
    """Cache hits the policy may trust: none without an index, none for degraded replicas, at
    most the prompt's blocks; a replica missing from the result has no usable block. Walks the
    index's answer (the few holders), not the pool (maybe a thousand candidates), so it may
    name replicas that are not candidates: the policy only ever looks candidates up."""
    if not inputs.index_available:
        return {}
    degraded_ids = inputs.degraded_replica_ids
    num_prompt_blocks = inputs.num_prompt_blocks
    hits: dict[str, int] = {}
    for replica_id, num_hit_blocks in inputs.cache_hits.items():
        num_usable = min(num_hit_blocks, num_prompt_blocks)
        if num_usable and replica_id not in degraded_ids:
            hits[replica_id] = num_usable
    return hits


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
    costs = _load_costs(rotated, weights, inputs.block_size)
    costs = with_adapter_costs(costs, rotated, inputs.lora_name)
    ranked = [rotated[i].replica_id for i in _by_cost(costs)]
    return _decision(inputs, ranked, RoutingReason.LEAST_LOADED, usable_hits(inputs))


def choose_prefix_aware(
    inputs: RoutingInputs, weights: CostWeights, hot_spot: HotSpotConfig
) -> RoutingDecision:
    """Cache affinity against load; see the module docstring for the rules."""
    rotated = _rotated(inputs)
    hits = usable_hits(inputs)
    costs, holders = _total_costs(rotated, hits, inputs, weights)
    costs = with_adapter_costs(costs, rotated, inputs.lora_name)
    ranked = [rotated[i].replica_id for i in _by_cost(costs)]
    pinned = _live_pin(rotated, inputs, hot_spot)
    if pinned is not None:
        ranked.remove(pinned)
        return _decision(inputs, [pinned, *ranked], RoutingReason.SESSION_AFFINITY, hits)
    hot = _hot_spot(rotated, holders, hits, hot_spot)
    if hot is not None:
        was_first = ranked[0] == hot
        ranked.remove(hot)
        ranked.append(hot)
        if was_first:
            return _decision(inputs, ranked, RoutingReason.HOT_SPOT_AVOIDED, hits)
    return _decision(inputs, ranked, _plain_reason(inputs, hits, ranked[0]), hits)


def _by_cost(costs: list[float]) -> list[int]:
    """Indexes by cost, equal costs in index order: ``sorted`` is stable (and only ever asks
    whether a later key is less than an earlier one), so a plain float key ranks exactly as a
    ``(cost, index)`` key, without building and comparing a thousand tuples."""
    return sorted(range(len(costs)), key=costs.__getitem__)


def _live_pin(
    candidates: list[ReplicaLoad], inputs: RoutingInputs, hot_spot: HotSpotConfig
) -> str | None:
    """The session's pinned replica while the pin lasts, it is a candidate and not overloaded.
    A list comprehension over the whole pool beats a generator stopping at the pin."""
    pin = inputs.session_pin
    if pin is None or not inputs.now_s < pin.expires_at_s:
        return None
    pinned = [c for c in candidates if c.replica_id == pin.replica_id]
    if not pinned or hot_spot.is_overloaded(pinned[-1]):
        return None
    return pin.replica_id


def lower_tier_cost(load: ReplicaLoad, hit: TierHit, weights: CostWeights) -> float:
    """Host and disk hits in uncached-block units: each costs its tier's measured load time
    over recompute time (the prior until the replica has measured it)."""
    host = weights.host_block_prior if load.host_block_cost is None else load.host_block_cost
    disk = weights.disk_block_prior if load.disk_block_cost is None else load.disk_block_cost
    return hit.num_host * host + hit.num_disk * disk


def _load_costs(
    candidates: list[ReplicaLoad], weights: CostWeights, block_size: int
) -> list[float]:
    """:func:`load_cost` of every candidate, in one loop with the weights read once and
    ``kv_usage`` and ``num_requests`` inlined (a call per candidate is most of the time at a
    thousand candidates). The arithmetic is load_cost's, term for term and in the same order,
    so costs tie exactly as they do there (``test_policy_equivalence`` holds them together)."""
    active_block, request, kv_usage = weights.active_block, weights.request, weights.kv_usage
    block_size = max(block_size, 1)
    costs: list[float] = []
    for load in candidates:
        num_used, num_free = load.num_used_blocks, load.num_free_blocks
        num_total = 0 if num_free is None else num_used + num_free
        usage = num_used / num_total if num_total > 0 else 0.0
        costs.append(
            active_block * load.num_active_tokens / block_size
            + request * (load.num_running_requests + load.num_queued_requests)
            + kv_usage * usage
        )
    return costs


def _total_costs(
    candidates: list[ReplicaLoad], hits: dict[str, int], inputs: RoutingInputs, weights: CostWeights
) -> tuple[list[float], list[ReplicaLoad]]:
    """Every candidate's cost, and the candidates with a hit (in order) for the hot-spot rule.

    A cost is the whole prompt uncached plus the load (:func:`_load_costs`'s arithmetic,
    inlined again: one loop over the pool instead of two), plus ``no_room`` when the free
    blocks cannot hold the prompt. The few candidates with a hit take :func:`_hit_cost`; the
    rest cost one ``hits`` lookup and no ``tier_hits`` lookup."""
    active_block, request, kv_usage = weights.active_block, weights.request, weights.kv_usage
    block_size = max(inputs.block_size, 1)
    num_needed = -(-max(inputs.num_prompt_tokens, 1) // block_size)
    uncached_cost = weights.uncached_block * inputs.num_prompt_blocks
    no_room = weights.no_room
    costs: list[float] = []
    holders: list[ReplicaLoad] = []
    for load in candidates:
        num_used, num_free = load.num_used_blocks, load.num_free_blocks
        num_total = 0 if num_free is None else num_used + num_free
        usage = num_used / num_total if num_total > 0 else 0.0
        load_part = (
            active_block * load.num_active_tokens / block_size
            + request * (load.num_running_requests + load.num_queued_requests)
            + kv_usage * usage
        )
        if load.replica_id in hits:
            holders.append(load)
            cost = _hit_cost(load, hits[load.replica_id], load_part, num_needed, inputs, weights)
        else:
            cost = uncached_cost + load_part
            if num_free is not None and num_free < num_needed:
                cost += no_room
        costs.append(cost)
    return costs, holders


def _hit_cost(
    load: ReplicaLoad,
    num_hit_blocks: int,
    load_part: float,
    num_needed: int,
    inputs: RoutingInputs,
    weights: CostWeights,
) -> float:
    """The cost of a candidate caching ``num_hit_blocks`` leading blocks: those on its host or
    disk tier count at :func:`lower_tier_cost`, and only those on its device take no room."""
    num_uncached: float = inputs.num_prompt_blocks - num_hit_blocks
    num_on_device = num_hit_blocks
    tier_hit = inputs.tier_hits.get(load.replica_id)
    if tier_hit is not None:
        num_uncached += lower_tier_cost(load, tier_hit, weights)
        num_on_device = max(0, num_hit_blocks - tier_hit.num_host - tier_hit.num_disk)
    cost = weights.uncached_block * num_uncached + load_part
    if load.num_free_blocks is not None and load.num_free_blocks < num_needed - num_on_device:
        cost += weights.no_room
    return cost


def _hot_spot(
    candidates: list[ReplicaLoad],
    holders: list[ReplicaLoad],
    hits: dict[str, int],
    hot_spot: HotSpotConfig,
) -> str | None:
    """The best cache holder (the first of ``holders`` holding the most blocks) when it is
    overloaded while another candidate is idle."""
    if len(candidates) < 2 or not holders:
        return None
    best = max(holders, key=lambda c: hits[c.replica_id])
    if hits[best.replica_id] > 0 and hot_spot.is_overloaded(best):
        return best.replica_id if hot_spot.any_idle(candidates, besides=best) else None
    return None


def _plain_reason(inputs: RoutingInputs, hits: dict[str, int], chosen: str) -> RoutingReason:
    # stops at the first fresh candidate: the first one, unless the index is mostly degraded
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
