"""The ``hot_prefix`` policy's score: a cache hit's saved prefill seconds against the queue it
joins, one formula in seconds.

For every candidate, with ``tps`` its measured prefill throughput (``ReplicaLoad``'s
``prefill_tokens_per_s``; ``HotPrefixConfig.prefill_tokens_per_s`` until it has measured one):

    queue_s   = max(tokens this router sent and has not seen finish,
                    prompt tokens the replica reports queued) / tps
    prefill_s = (prompt tokens - device hit tokens
                 - host/disk hit tokens * (1 - the tier's load-to-recompute ratio)) / tps
    cost_s    = queue_s + prefill_s (+ no_room_s when its free blocks cannot hold the prompt)

so a hit is worth exactly the prefill seconds its blocks save, and a holder whose queue is
longer than that loses to an idle replica without it. There is no separate hot-spot rule: an
overloaded holder's queue already says it in the same seconds. A live session pin wins unless
its queue alone is longer than ``ttft_target_s``. Degraded replicas' hits count as zero, as in
``prefix_aware``. The same :class:`CandidateSeconds` feed the replication decision
(``prefix_replication``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.routing.policies import lower_tier_cost, usable_hits
from cluster.routing.policy_types import (
    CostWeights,
    ReplicaLoad,
    RoutingDecision,
    RoutingInputs,
    RoutingReason,
)
from core.config import HotPrefixConfig


@dataclass(frozen=True)
class CandidateSeconds:
    """One candidate's predicted time to first token for this request, split in its parts."""

    replica_id: str
    num_hit_blocks: int  # usable leading blocks it caches (any medium)
    queue_s: float
    prefill_s: float
    no_room_s: float

    @property
    def cost_s(self) -> float:
        """Queue plus uncached prefill plus the no-room penalty."""
        return self.queue_s + self.prefill_s + self.no_room_s


def throughput(load: ReplicaLoad, config: HotPrefixConfig) -> float:
    """The candidate's prefill tokens per second: measured, else the configured prior."""
    measured = load.prefill_tokens_per_s
    return measured if measured is not None and measured > 0.0 else config.prefill_tokens_per_s


def score_candidates(inputs: RoutingInputs, config: HotPrefixConfig) -> list[CandidateSeconds]:
    """Every candidate's :class:`CandidateSeconds`, in the order of ``inputs.candidates``."""
    hits = usable_hits(inputs)
    block_size = max(inputs.block_size, 1)
    num_prompt_tokens = max(inputs.num_prompt_tokens, inputs.num_prompt_blocks * block_size)
    num_needed = -(-max(num_prompt_tokens, 1) // block_size)
    priors = CostWeights.for_role(inputs.role)  # the tiers' unmeasured load/recompute ratios
    scores: list[CandidateSeconds] = []
    for load in inputs.candidates:
        tps = throughput(load, config)
        num_hit = hits.get(load.replica_id, 0)
        num_saved_blocks: float = num_hit
        num_on_device = num_hit
        tier_hit = inputs.tier_hits.get(load.replica_id)
        if num_hit and tier_hit is not None:
            num_saved_blocks = num_hit - lower_tier_cost(load, tier_hit, priors)
            num_on_device = max(0, num_hit - tier_hit.num_host - tier_hit.num_disk)
        num_uncached = max(0.0, num_prompt_tokens - num_saved_blocks * block_size)
        num_queued = max(load.num_active_tokens, load.num_pending_prompt_tokens)
        no_room = load.num_free_blocks is not None and load.num_free_blocks < (
            num_needed - num_on_device
        )
        scores.append(
            CandidateSeconds(
                replica_id=load.replica_id,
                num_hit_blocks=num_hit,
                queue_s=num_queued / tps,
                prefill_s=num_uncached / tps,
                no_room_s=config.no_room_s if no_room else 0.0,
            )
        )
    return scores


def choose_hit_minus_load(
    inputs: RoutingInputs, config: HotPrefixConfig
) -> tuple[RoutingDecision, list[CandidateSeconds]]:
    """The decision (see the module docstring) and every candidate's seconds."""
    if not inputs.candidates:
        raise ValueError("a routing decision needs at least one candidate replica")
    scores = score_candidates(inputs, config)
    start = inputs.tie_break % len(scores)
    rotated = scores[start:] + scores[:start]  # equal costs spread over the pool
    ranked = [s.replica_id for s in sorted(rotated, key=lambda s: s.cost_s)]
    hits = {s.replica_id: s.num_hit_blocks for s in scores if s.num_hit_blocks}
    pinned = _live_pin(inputs, scores, config)
    if pinned is not None:
        ranked.remove(pinned)
        ranked.insert(0, pinned)
        reason = RoutingReason.SESSION_AFFINITY
    else:
        reason = _reason(inputs, hits, ranked[0])
    decision = RoutingDecision(
        replica_id=ranked[0],
        reason=reason,
        ranked_replica_ids=tuple(ranked),
        num_cached_blocks=hits.get(ranked[0], 0),
        num_prompt_blocks=inputs.num_prompt_blocks,
    )
    return decision, scores


def _live_pin(
    inputs: RoutingInputs, scores: Sequence[CandidateSeconds], config: HotPrefixConfig
) -> str | None:
    pin = inputs.session_pin
    if pin is None or not inputs.now_s < pin.expires_at_s:
        return None
    for score in scores:
        if score.replica_id == pin.replica_id:
            return pin.replica_id if score.queue_s <= config.ttft_target_s else None
    return None


def _reason(inputs: RoutingInputs, hits: dict[str, int], chosen: str) -> RoutingReason:
    all_degraded = all(c.replica_id in inputs.degraded_replica_ids for c in inputs.candidates)
    if not inputs.index_available or all_degraded:
        return RoutingReason.DEGRADED_INDEX
    return RoutingReason.CACHE_HIT if hits.get(chosen, 0) > 0 else RoutingReason.LEAST_LOADED


@dataclass(frozen=True)
class HotPrefixPolicy:
    """``hot_prefix``: hit minus load in seconds (the router adds heat and deliberate copies)."""

    config: HotPrefixConfig
    name: str = "hot_prefix"

    def choose(self, inputs: RoutingInputs) -> RoutingDecision:
        """Rank by :func:`choose_hit_minus_load`."""
        return choose_hit_minus_load(inputs, self.config)[0]
