"""The routing policy's inputs and output: plain frozen dataclasses, no Ray, no clocks.

A router builds one :class:`RoutingInputs` per decision (candidate replicas with their load,
the prompt's block hashes, the index's cache hits, the session's pin) and a policy turns it
into a :class:`RoutingDecision` (a ranking of every candidate plus the reason for the first).
Weights and thresholds are :class:`CostWeights` and :class:`HotSpotConfig`; the defaults differ
per pool role because prefill optimises cache affinity and decode optimises load and free KV.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cluster.routing.kv_index.holders import TierHit
from core.hashing import BlockHash


class PoolRole(enum.StrEnum):
    """Which pool a router places requests in."""

    PREFILL = "prefill"
    DECODE = "decode"


class RoutingReason(enum.StrEnum):
    """Why the first-ranked replica was chosen (a metrics label)."""

    CACHE_HIT = "cache_hit"  # lowest cost, and it caches a prefix of the prompt
    LEAST_LOADED = "least_loaded"  # lowest cost without any cached prefix
    SESSION_AFFINITY = "session_affinity"  # the session's pinned replica (not overloaded)
    HOT_SPOT_AVOIDED = "hot_spot_avoided"  # the best cache holder was overloaded, one was idle
    ROUND_ROBIN = "round_robin"  # the round-robin baseline
    DEGRADED_INDEX = "degraded_index"  # no trustworthy index: chosen by load only


@dataclass(frozen=True)
class ReplicaLoad:
    """One candidate replica as the router sees it now."""

    replica_id: str
    num_active_tokens: int = 0  # tokens of work routed here and not finished
    num_running_requests: int = 0  # requests in flight to this replica
    num_queued_requests: int = 0  # requests waiting inside the replica (reported)
    num_used_blocks: int = 0  # KV blocks held (reported)
    num_free_blocks: int | None = None  # KV blocks allocatable (reported); None = unknown
    host_block_cost: float | None = None  # host-tier load / recompute, measured; None = unknown
    disk_block_cost: float | None = None  # the same for the disk tier
    num_pending_prompt_tokens: int = 0  # prompt tokens queued inside the replica (reported)
    prefill_tokens_per_s: float | None = None  # measured prefill throughput; None = unknown
    device_adapters: frozenset[str] = frozenset()  # LoRA adapters in a device slot (reported)
    host_adapters: frozenset[str] = frozenset()  # LoRA adapters in host memory only (reported)

    @property
    def kv_usage(self) -> float:
        """Used fraction of the KV cache (0.0 when unknown)."""
        if self.num_free_blocks is None:
            return 0.0
        total = self.num_used_blocks + self.num_free_blocks
        return self.num_used_blocks / total if total > 0 else 0.0

    @property
    def num_requests(self) -> int:
        """Requests in flight plus those waiting inside the replica."""
        return self.num_running_requests + self.num_queued_requests


@dataclass(frozen=True)
class SessionPin:
    """A session's sticky replica and when the stickiness lapses."""

    replica_id: str
    expires_at_s: float


@dataclass(frozen=True)
class RoutingInputs:
    """Everything one routing decision depends on."""

    role: PoolRole
    candidates: tuple[ReplicaLoad, ...]
    block_hashes: tuple[BlockHash, ...] = ()
    block_size: int = 16
    num_prompt_tokens: int = 0
    cache_hits: Mapping[str, int] = field(default_factory=dict)  # leading blocks cached
    tier_hits: Mapping[str, TierHit] = field(default_factory=dict)  # the same, by medium
    index_available: bool = True  # False: no fresh index view at all
    degraded_replica_ids: frozenset[str] = frozenset()
    session_pin: SessionPin | None = None
    now_s: float = 0.0
    tie_break: int = 0  # rotates the order among equal costs
    lora_name: str | None = None  # the request's LoRA adapter (None: the base model)

    @property
    def num_prompt_blocks(self) -> int:
        """Full prompt blocks (those that have a hash)."""
        return len(self.block_hashes)


@dataclass(frozen=True)
class RoutingDecision:
    """The chosen replica first, then every other candidate in order of preference."""

    replica_id: str
    reason: RoutingReason
    ranked_replica_ids: tuple[str, ...]
    num_cached_blocks: int = 0  # prompt blocks the chosen replica already caches
    num_prompt_blocks: int = 0


@dataclass(frozen=True)
class CostWeights:
    """cost = uncached_block * (uncached blocks + host_cost * host hits + disk_cost * disk hits)
    + active_block * active tokens / block_size + request * requests + kv_usage * used fraction
    (+ no_room when the blocks do not fit). ``host_cost`` and ``disk_cost`` are the candidate's
    measured load-to-recompute ratios (``ReplicaLoad``); the priors stand in until a replica
    has measured them: the worst ratios ``benchmarks/kv_tiers.py`` accepts (0.2 and 0.5), so an
    unmeasured tier is never credited more than the tiers are built to deliver."""

    uncached_block: float = 1.0
    active_block: float = 1.0
    request: float = 1.0
    kv_usage: float = 4.0
    no_room: float = 1000.0
    host_block_prior: float = 0.2
    disk_block_prior: float = 0.5

    @classmethod
    def for_role(cls, role: PoolRole) -> CostWeights:
        """Defaults: prefill pays a whole block of compute per uncached block; decode only a
        pull, and weighs running sequences and KV pressure much more."""
        if role is PoolRole.DECODE:
            return cls(uncached_block=0.25, active_block=0.1, request=2.0, kv_usage=32.0)
        return cls()


@dataclass(frozen=True)
class HotSpotConfig:
    """When a replica counts as overloaded (then it loses hot-spot and affinity ties)."""

    overload_requests: int = 8  # in flight + waiting at or above this
    overload_kv_usage: float = 0.95
    idle_requests: int = 0  # in flight + waiting at or below this (and no active tokens)

    def is_overloaded(self, load: ReplicaLoad) -> bool:
        """True when ``load`` is beyond either threshold."""
        return (
            load.num_requests >= self.overload_requests or load.kv_usage >= self.overload_kv_usage
        )

    def is_idle(self, load: ReplicaLoad) -> bool:
        """True when ``load`` has (almost) nothing to do."""
        return load.num_requests <= self.idle_requests and load.num_active_tokens == 0

    def any_idle(self, loads: Iterable[ReplicaLoad], besides: ReplicaLoad) -> bool:
        """True when one of ``loads`` other than ``besides`` is idle. Only a replica without
        active tokens can be, and a list comprehension finds those several times faster than
        calling :meth:`is_idle` on each of a thousand busy candidates."""
        unoccupied = [load for load in loads if load.num_active_tokens == 0]
        return any(self.is_idle(load) for load in unoccupied if load is not besides)
