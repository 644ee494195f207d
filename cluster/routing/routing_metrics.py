"""Routing metrics as plain counters with a typed :meth:`RoutingMetrics.snapshot`.

Serve constructs the request routers inside the ingress process, so they record into the
process-wide :func:`routing_metrics` object; the ingress renders its :class:`RoutingSnapshot`
on ``/metrics`` (``pdserve:routing_decisions_total{pool,reason}``,
``pdserve:routing_prefix_hit_rate{pool}`` (cached over prompt blocks at the chosen replica),
``pdserve:routing_decision_seconds_p50{pool}``, ``pdserve:kv_index_*``, and the ``hot_prefix``
policy's ``pdserve:hot_prefixes{pool}``, ``pdserve:prefix_copies_made_total{pool}``,
``pdserve:prefix_copies_dropped_total{pool}``, ``pdserve:prefix_copy_bytes_total{pool}``, and
``pdserve:routing_policy{pool,policy}``: 1 for the policy the pool's router ranks by now) and
returns it, as plain data through ``core.codec``, from its ``routing_snapshot`` Serve method.
Thread-safe: Serve may run routers on its own loop thread while the ingress reads.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from cluster.routing.kv_index.index import IndexStats
from cluster.routing.policy_types import RoutingDecision

LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
_RECENT_LATENCIES = 2048


@dataclass(frozen=True)
class LatencySummary:
    """How long one pool's routing decisions took."""

    count: int
    sum: float
    """Seconds, over every decision."""
    p50: float
    """Seconds, over the recent decisions."""
    p99: float
    buckets: dict[str, int]
    """Cumulative counts by upper bound in seconds (``"0.0001"`` ... ``"+Inf"``)."""


@dataclass(frozen=True)
class PoolRoutingSnapshot:
    """One pool's decisions by reason, prefix hits at the chosen replicas and decision time."""

    decisions_total: dict[str, int]
    prompt_blocks_total: int
    cached_blocks_total: int
    prefix_hit_rate: float
    decision_latency_s: LatencySummary
    hot_prefixes: int = 0
    """Prefixes with a deliberate copy now (``hot_prefix`` policy)."""
    prefix_copies_made_total: int = 0
    prefix_copies_dropped_total: int = 0
    """Deliberate copies retired (the prefix cooled), given up (never landed) or lost."""
    prefix_copy_bytes_total: int = 0
    """KV bytes the deliberate copies were to move."""
    policy: str = ""
    """The policy the pool's router ranks by now (empty: none reported)."""


@dataclass(frozen=True)
class RoutingSnapshot:
    """Every pool's routing figures, and the index size the latest sync saw (None before)."""

    pools: dict[str, PoolRoutingSnapshot]
    index: IndexStats | None = None
    index_shard_losses_total: int = 0
    """Times a router stopped trusting an unreachable index shard's replicas."""
    index_restarts_total: int = 0
    """Times a router found an index shard restarted (a new epoch) and reloaded it."""


@dataclass
class _PoolMetrics:
    decisions: Counter[str] = field(default_factory=Counter)
    prompt_blocks_total: int = 0
    cached_blocks_total: int = 0
    latency_count: int = 0
    latency_sum_s: float = 0.0
    bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    recent_s: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT_LATENCIES))
    hot_prefixes: int = 0
    copies_made: int = 0
    copies_dropped: int = 0
    copy_bytes: int = 0
    policy: str = ""

    def snapshot(self) -> PoolRoutingSnapshot:
        cumulative, buckets = 0, {}
        for bound, count in zip((*LATENCY_BUCKETS_S, math.inf), self.bucket_counts, strict=True):
            cumulative += count
            buckets["+Inf" if bound == math.inf else repr(bound)] = cumulative
        recent = sorted(self.recent_s)
        return PoolRoutingSnapshot(
            decisions_total=dict(self.decisions),
            prompt_blocks_total=self.prompt_blocks_total,
            cached_blocks_total=self.cached_blocks_total,
            prefix_hit_rate=(
                self.cached_blocks_total / self.prompt_blocks_total
                if self.prompt_blocks_total
                else 0.0
            ),
            decision_latency_s=LatencySummary(
                count=self.latency_count,
                sum=self.latency_sum_s,
                p50=_quantile(recent, 0.5),
                p99=_quantile(recent, 0.99),
                buckets=buckets,
            ),
            hot_prefixes=self.hot_prefixes,
            prefix_copies_made_total=self.copies_made,
            prefix_copies_dropped_total=self.copies_dropped,
            prefix_copy_bytes_total=self.copy_bytes,
            policy=self.policy,
        )


class RoutingMetrics:
    """Decisions by reason, prefix hit rate and decision latency per pool; index size."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, _PoolMetrics] = {}
        self._index: IndexStats | None = None
        self._shard_losses = 0
        self._restarts = 0

    def record_decision(self, pool: str, decision: RoutingDecision, latency_s: float) -> None:
        """Count one routing decision and how long it took."""
        with self._lock:
            metrics = self._pools.setdefault(pool, _PoolMetrics())
            metrics.decisions[decision.reason.value] += 1
            metrics.prompt_blocks_total += decision.num_prompt_blocks
            metrics.cached_blocks_total += decision.num_cached_blocks
            metrics.latency_count += 1
            metrics.latency_sum_s += latency_s
            bucket = next(
                (i for i, b in enumerate(LATENCY_BUCKETS_S) if latency_s <= b),
                len(LATENCY_BUCKETS_S),
            )
            metrics.bucket_counts[bucket] += 1
            metrics.recent_s.append(latency_s)

    def record_prefix_copies(
        self, pool: str, *, num_made: int, num_dropped: int, num_bytes: int, num_hot: int
    ) -> None:
        """Count deliberate prefix copies made and dropped and their bytes; ``num_hot`` is
        the prefixes with a copy now (a gauge)."""
        with self._lock:
            metrics = self._pools.setdefault(pool, _PoolMetrics())
            metrics.copies_made += num_made
            metrics.copies_dropped += num_dropped
            metrics.copy_bytes += num_bytes
            metrics.hot_prefixes = num_hot

    def record_policy(self, pool: str, policy: str) -> None:
        """The policy ``pool``'s router ranks by from now on (a router's start, or an
        in-place upgrade of ``routing.policy``)."""
        with self._lock:
            self._pools.setdefault(pool, _PoolMetrics()).policy = policy

    def record_index(self, stats: IndexStats) -> None:
        """Remember the index size seen by the latest sync (a gauge)."""
        with self._lock:
            self._index = stats

    def record_shard_lost(self) -> None:
        """Count one index shard given up as unreachable (its replicas route by load)."""
        with self._lock:
            self._shard_losses += 1

    def record_index_restart(self) -> None:
        """Count one index shard seen restarted (its replicas republish; routers reload it)."""
        with self._lock:
            self._restarts += 1

    def snapshot(self) -> RoutingSnapshot:
        """Every metric now."""
        with self._lock:
            pools = {pool: m.snapshot() for pool, m in self._pools.items()}
            return RoutingSnapshot(pools, self._index, self._shard_losses, self._restarts)

    def reset(self) -> None:
        """Forget everything (benchmarks between runs, tests)."""
        with self._lock:
            self._pools.clear()
            self._index = None
            self._shard_losses = 0
            self._restarts = 0
        self._restarts = 0


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


_PROCESS_METRICS = RoutingMetrics()


def routing_metrics() -> RoutingMetrics:
    """The metrics every router in this process records into."""
    return _PROCESS_METRICS
