"""``routing:`` and ``disaggregation:``: where the ingress sends a request, and whether it
splits the request's prefill from its decode.

Both used to live under one ``scheduler:`` section, a name the engine's batch scheduler also
has; :data:`MOVED_KEYS` says where each of its keys went, for the error an old config gets.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core.config.base import StrictModel


class RoutingConfig(StrictModel):
    """How a prefill and a decode replica are picked for a request, and re-picked."""

    policy: Literal["round_robin", "least_loaded", "prefix_aware"] = Field(
        "prefix_aware", description="How a prefill and a decode replica are picked."
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
