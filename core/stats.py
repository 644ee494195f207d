"""What a prefill or decode replica reports about itself, as typed messages.

A replica's :class:`ReplicaStats` reach the stats board every half second inside a
:class:`ReplicaReport` (``/metrics``, ``pdserve status``, "is any prefill replica alive") and,
cut down to :class:`RoutingStats`, the pool's request routers through Serve's routing-stats hook.
All of them cross processes through ``core.codec``; readers use fields, never string keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.lora_registry import AdapterRefusal


@dataclass(frozen=True)
class TransferStats:
    """One side (export or import) of a replica's KV transfers, counted since it started."""

    in_flight: int = 0
    bytes_total: int = 0
    transfers_total: int = 0
    seconds_total: float = 0.0
    failures_total: int = 0
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    """``core.kv_handle.TransferFailure`` value -> count."""
    leases_expired_total: int = 0
    unauthenticated_calls_total: int = 0
    """Export side: calls refused for a missing or wrong auth token."""
    pulls_by_path: dict[str, int] = field(default_factory=dict)
    """Import side: pulls by the path that moved their bytes (``grpc``, ``same_node``)."""
    same_node_fallbacks_by_reason: dict[str, int] = field(default_factory=dict)
    """Import side: pulls that went over gRPC instead of the same-node path, by why (``off``,
    ``no_region``, ``other_node``, ``unmapped``)."""


@dataclass(frozen=True)
class KVTierStats:
    """One KV tier of a replica (``device``, ``host`` or ``disk``); counters since it started."""

    medium: str
    blocks_used: int = 0
    """Blocks holding cached KV (on ``device``: held by requests)."""
    blocks_capacity: int = 0
    hits_total: int = 0
    """Prefix blocks found in this tier by a lookup."""
    offload_bytes_total: int = 0
    """Bytes written into this tier from the tier above."""
    offload_seconds_total: float = 0.0
    onload_bytes_total: int = 0
    """Bytes brought back from this tier to the device."""
    onload_seconds_total: float = 0.0
    onload_blocks_total: int = 0
    ttl_expiries_total: int = 0
    """Blocks demoted or released because they sat idle past the tier's TTL."""
    evictions_total: int = 0


@dataclass(frozen=True)
class ExpertLoadStats:
    """An expert-parallel rank's load: lockstep steps and the tokens its experts computed."""

    rank: int
    steps_total: int
    idle_steps_total: int
    expert_tokens_total: int
    imbalance: float
    """Hottest expert's tokens over the mean (1.0: perfectly balanced)."""
    all_to_all_bytes_total: int


@dataclass(frozen=True)
class RoutingStats:
    """What a request router weighs besides cached prefixes (Serve's ``routing_stats``)."""

    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int | None = None
    """``None`` until the replica reported."""
    host_block_cost: float | None = None
    """Loading one block from the host tier, as a fraction of recomputing it (measured on this
    replica; ``None`` until it has both loaded from host and computed a prompt)."""
    disk_block_cost: float | None = None
    """The same for the disk tier."""
    pending_prompt_tokens: int = 0
    """Prompt tokens queued or being prefilled here, not computed yet."""
    prefill_tokens_per_s: float | None = None
    """Prompt tokens computed per second of prefill step time, measured here; ``None`` until
    this replica has computed a prompt."""
    kv_block_bytes: int = 0
    """Bytes of one KV block (all layers, K and V); 0 until reported."""
    kv_fingerprint: str = ""
    """The replica's KV fingerprint (``ReplicaStats.kv_fingerprint``): routers pair by it."""
    device_adapters: tuple[str, ...] = ()
    """LoRA adapters in a device slot (their requests run without a load)."""
    host_adapters: tuple[str, ...] = ()
    """LoRA adapters in host memory only (a copy into a slot before they run)."""


@dataclass(frozen=True)
class SpecDecodeStats:
    """Speculative decoding counters since the engine started (vLLM's ``spec_decode_*``)."""

    num_drafts: int = 0
    """Verify rows run (``vllm:spec_decode_num_drafts_total``)."""
    num_draft_tokens: int = 0
    """Draft tokens verified (``vllm:spec_decode_num_draft_tokens_total``)."""
    num_accepted_tokens: int = 0
    """Draft tokens accepted (``vllm:spec_decode_num_accepted_tokens_total``)."""
    num_accepted_tokens_per_pos: tuple[int, ...] = ()
    """Accepted drafts by position in the draft, first first
    (``vllm:spec_decode_num_accepted_tokens_per_pos``)."""

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verify row yields on average: 1 + accepted drafts per draft (1.0: none
        ran or none was accepted)."""
        return 1.0 + (self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0)


@dataclass(frozen=True)
class LoRAAdapterStats:
    """One LoRA adapter loaded on a replica: where it is and its requests."""

    name: str
    residency: str
    """``device`` (in a slot) or ``host`` (in host memory); a cold adapter is not listed."""
    requests_total: int = 0
    """Requests run under it since the replica started."""
    num_running: int = 0
    """Its requests in the latest step."""
    num_waiting: int = 0
    """Its admitted requests that were not in the latest step."""


@dataclass(frozen=True)
class ReplicaStats:
    """KV blocks, queues, transfers and request counts of one replica."""

    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    num_running: int = 0
    num_waiting: int = 0
    """Queued requests, including those waiting for imported KV."""
    num_waiting_for_kv: int = 0
    num_pinned: int = 0
    """Finished prefills whose blocks stay pinned for export."""
    exports_pinned: int = 0
    """Prefill: exports live under a lease."""
    imports_in_progress: int = 0
    """Decode: KV imports not yet handed to the batch."""
    requests_total: int = 0
    """Calls this replica received."""
    transfer: TransferStats = TransferStats()
    expert_load: ExpertLoadStats | None = None
    kv_tiers: tuple[KVTierStats, ...] = ()
    """The host and disk tiers (and the device tier's tier counters) when tiers are on."""
    kv_block_size: int = 0
    prefill_tokens_total: int = 0
    """Prompt tokens this replica computed (prefix-cache and tier hits excluded)."""
    prefill_seconds_total: float = 0.0
    """Their share of step time (``engine.prefill_rate``)."""
    pending_prompt_tokens: int = 0
    """Prompt tokens queued or being prefilled, not computed yet (the planner's prefill load)."""
    spec_decode: SpecDecodeStats = SpecDecodeStats()
    """Speculative decoding's counters (all zero when the engine does not speculate)."""
    kv_block_bytes: int = 0
    """Bytes of one KV block on this replica (all layers, K and V)."""
    handoffs_total: int = 0
    """Decode: requests this replica stopped and handed off, their blocks exported, as it left."""
    handoff_blocks_pulled_total: int = 0
    """Decode: KV blocks this replica pulled for requests another one handed off."""
    # KV compatibility (rolling upgrades)
    kv_fingerprint: str = ""
    """``core.kv_compat.KVCompat.fingerprint()`` of this replica's KV: only replicas of one
    fingerprint exchange KV or share prefix-cache hits (empty: undeclared)."""
    # -- multi-LoRA ------------------------------------------------------------------------
    lora_adapters: tuple[LoRAAdapterStats, ...] = ()
    """The adapters loaded here (device or host), least recently used first."""
    max_loras: int = 0
    """Adapter slots on the device (0: the engine serves no adapters)."""
    served_adapters: tuple[str, ...] = ()
    """Every adapter this replica serves (loaded or cold): the YAML's and the registered ones."""
    adapter_refusals: tuple[AdapterRefusal, ...] = ()
    """Registered adapters this replica refused (each one's typed error)."""

    def routing(self) -> RoutingStats:
        """The part a request router reads."""
        return RoutingStats(
            self.num_waiting,
            self.kv_blocks_used,
            self.kv_blocks_free,
            host_block_cost=self.tier_block_cost("host"),
            disk_block_cost=self.tier_block_cost("disk"),
            pending_prompt_tokens=self.pending_prompt_tokens,
            prefill_tokens_per_s=(
                self.prefill_tokens_total / self.prefill_seconds_total
                if self.prefill_tokens_total and self.prefill_seconds_total > 0.0
                else None
            ),
            kv_block_bytes=self.kv_block_bytes,
            device_adapters=tuple(a.name for a in self.lora_adapters if a.residency == "device"),
            host_adapters=tuple(a.name for a in self.lora_adapters if a.residency == "host"),
        )

    def tier_block_cost(self, medium: str) -> float | None:
        """Mean seconds to load a block from ``medium`` over mean seconds to compute one;
        ``None`` until both were measured here."""
        tier = next((t for t in self.kv_tiers if t.medium == medium), None)
        if tier is None or not tier.onload_blocks_total or not self.prefill_tokens_total:
            return None
        compute_s = self.prefill_seconds_total / self.prefill_tokens_total * self.kv_block_size
        if compute_s <= 0.0:
            return None
        return tier.onload_seconds_total / tier.onload_blocks_total / compute_s


@dataclass(frozen=True)
class ReplicaReport:
    """One replica's post to the stats board: who and where it is, and its stats."""

    role: str
    replica_id: str
    actor_name: str
    node_id: str
    node_ip: str
    pid: int
    stats: ReplicaStats
    model: str = ""
    """The scope of the model this replica serves (``ServedModel.scope``; empty: the only one)."""
