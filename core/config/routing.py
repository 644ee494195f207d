"""``routing:`` and ``disaggregation:``: where the ingress sends a request, and whether it
splits the request's prefill from its decode.

Both used to live under one ``scheduler:`` section, a name the engine's batch scheduler also
has; :data:`MOVED_KEYS` says where each of its keys went, for the error an old config gets.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import StrictModel


class HotPrefixConfig(StrictModel):
    """The ``hot_prefix`` policy: routing by a hit's saved prefill seconds against the queue a
    request joins, and deliberate copies of prefixes too hot for their holders."""

    prefill_tokens_per_s: float = Field(
        8000.0,
        gt=0.0,
        description="A replica's prefill throughput until it has measured its own (prompt "
        "tokens computed over their share of step time): turns queued and uncached tokens "
        "into seconds.",
    )
    ttft_target_s: float = Field(
        1.0,
        gt=0.0,
        description="Predicted first-token wait (queue plus uncached prefill) above which a "
        "hot prefix's holders count as too slow and it is copied to another replica; a "
        "session's pinned replica is left when its queue alone is longer.",
    )
    no_room_s: float = Field(
        60.0,
        ge=0.0,
        description="Seconds added to a replica whose free KV blocks cannot hold the prompt.",
    )
    head_blocks: int = Field(
        1,
        ge=1,
        description="A prefix is named by the chained hash of a prompt's first this many "
        "blocks (shorter prompts: of all their blocks); heat is tracked per such head.",
    )
    heat_half_life_s: float = Field(
        10.0, gt=0.0, description="Half-life of a prefix's decayed request and token rates."
    )
    max_tracked_prefixes: int = Field(
        1024,
        ge=1,
        description="Prefix heads whose heat is kept; a new one evicts the coldest.",
    )
    min_copy_rate_per_s: float = Field(
        2.0,
        ge=0.0,
        description="A prefix is copied only while its decayed request rate is at least this.",
    )
    retire_rate_per_s: float = Field(
        1.0,
        ge=0.0,
        description="A deliberate copy is retired (its blocks left to the replica's LRU, no "
        "longer counted) when its prefix's request rate falls below this.",
    )
    max_copies_per_prefix: int = Field(
        2, ge=0, description="Deliberate copies of one prefix at most; 0 turns copying off."
    )
    copy_bytes_per_interval: int = Field(
        8 * 1024**3,
        ge=0,
        description="KV bytes all deliberate copies may move per copy interval.",
    )
    copy_interval_s: float = Field(
        10.0, gt=0.0, description="The window of copy_bytes_per_interval."
    )

    @model_validator(mode="after")
    def _retire_below_copy(self) -> HotPrefixConfig:
        if self.retire_rate_per_s > self.min_copy_rate_per_s:
            raise ValueError(
                f"routing.hot_prefixes.retire_rate_per_s ({self.retire_rate_per_s}) must not "
                f"exceed min_copy_rate_per_s ({self.min_copy_rate_per_s}): a copy would retire "
                "as soon as it was made"
            )
        return self


class RoutingConfig(StrictModel):
    """How a prefill and a decode replica are picked for a request, and re-picked."""

    policy: Literal["round_robin", "least_loaded", "prefix_aware", "hot_prefix"] = Field(
        "prefix_aware", description="How a prefill and a decode replica are picked."
    )
    hot_prefixes: HotPrefixConfig = Field(
        default_factory=HotPrefixConfig,
        description="The hot_prefix policy's throughput prior, TTFT target and copy limits.",
    )
    migration_limit: int = Field(
        3,
        ge=0,
        description="Times one request may move to another decode replica when the one "
        "streaming it dies, drains or stalls (it continues with the tokens already sent; "
        "greedy output unchanged). 0: such a request fails with a 503.",
    )
    kv_index_shards: int = Field(
        1,
        ge=1,
        le=256,
        description="Ray actors the cluster KV index is split over, by replica (each replica "
        "publishes its KV events to one; routers merge them). Ingest capacity grows with "
        "shards; 1 follows a few hundred replicas (docs/operations.md, 'The control plane "
        "at scale').",
    )
    kv_index_stride: int = Field(
        1,
        ge=1,
        le=64,
        description="Index one block hash in this many (those divisible by it): KV events, "
        "index memory and lookups shrink as many times, and a replica's cached prefix is "
        "known to within about this many blocks. 1 indexes every block.",
    )


class DisaggregationConfig(StrictModel):
    """When a prompt prefills on the prefill pool and when on its decode replica."""

    local_prefill_threshold_tokens: int = Field(
        64,
        ge=0,
        description="Prompts whose uncached part is shorter prefill locally on decode; "
        "0: always disaggregate while a prefill replica is healthy.",
    )
    fallback_to_local_prefill: bool = Field(
        True,
        description="Prefill locally on decode when a remote prefill fails; else fail cleanly.",
    )
    prefill_failover_cooldown_s: float = Field(
        5.0,
        gt=0.0,
        description="With fallback_to_local_prefill: after a remote prefill fails for lack of "
        "capacity (dead replica, unavailable pool, timeout), prefill locally for this long "
        "before trying the pool again.",
    )
    pipelined_handoff: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Start the decode (and its KV pull) as soon as the prefill starts, pulling "
        "each chunk's blocks while the next chunk computes: on, off, or auto (prompts longer "
        "than one prefill chunk, whose transfer can hide behind the rest of the prefill).",
    )


MOVED_KEYS: dict[str, str] = {
    "scheduler.policy": "routing.policy",
    "scheduler.migration_limit": "routing.migration_limit",
    "scheduler.local_prefill_threshold_tokens": "disaggregation.local_prefill_threshold_tokens",
    "scheduler.fallback_to_local_prefill": "disaggregation.fallback_to_local_prefill",
    "scheduler.prefill_failover_cooldown_s": "disaggregation.prefill_failover_cooldown_s",
    "scheduler.planner": "planner",
}
"""Each key of the old ``scheduler:`` section -> where it lives now."""
