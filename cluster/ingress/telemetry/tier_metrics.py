"""Prometheus families of the KV tiers, per model, role and tier (``device``, ``host``, ``disk``).

Read from each replica's ``ReplicaStats.kv_tiers``: occupancy as gauges over the live replicas,
hits, copies and expiries as counters over every replica ever seen (so a restart never lowers
them), summed per (model, role, tier).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from core.stats import KVTierStats, ReplicaStats

_Read = Callable[[KVTierStats], float]

_GAUGES: tuple[tuple[str, str, _Read], ...] = (
    ("pdserve:kv_tier_blocks_used", "KV blocks held in a tier.", lambda t: t.blocks_used),
    ("pdserve:kv_tier_blocks_capacity", "KV blocks a tier can hold.", lambda t: t.blocks_capacity),
)

_COUNTERS: tuple[tuple[str, str, _Read], ...] = (
    ("pdserve:kv_tier_hits", "Prefix blocks found in a tier.", lambda t: t.hits_total),
    (
        "pdserve:kv_tier_offload_bytes",
        "Bytes copied into a tier from the one above.",
        lambda t: t.offload_bytes_total,
    ),
    (
        "pdserve:kv_tier_offload_seconds",
        "Seconds spent copying blocks into a tier.",
        lambda t: t.offload_seconds_total,
    ),
    (
        "pdserve:kv_tier_onload_bytes",
        "Bytes brought back from a tier to the device.",
        lambda t: t.onload_bytes_total,
    ),
    (
        "pdserve:kv_tier_onload_seconds",
        "Seconds spent bringing blocks back from a tier.",
        lambda t: t.onload_seconds_total,
    ),
    (
        "pdserve:kv_tier_ttl_expiries",
        "Blocks demoted or released for idling past the tier's TTL.",
        lambda t: t.ttl_expiries_total,
    ),
    (
        "pdserve:kv_tier_evictions",
        "Blocks evicted from a tier for space.",
        lambda t: t.evictions_total,
    ),
)


PoolLabels = tuple[str, str]
"""``(model_name, role)`` of a pool's series."""


def tier_families(
    live: Mapping[PoolLabels, Sequence[ReplicaStats]],
    ever: Mapping[PoolLabels, Sequence[ReplicaStats]],
) -> Iterator[Metric]:
    """Gauges over ``live`` replicas, counters over ``ever`` (live and gone), by model, role
    and tier."""
    labels = ["model_name", "role", "tier"]
    for name, doc, read in _GAUGES:
        yield _sum(GaugeMetricFamily(name, doc, labels=labels), read, live)
    for name, doc, read in _COUNTERS:
        yield _sum(CounterMetricFamily(name, doc, labels=labels), read, ever)


def _sum(
    family: GaugeMetricFamily | CounterMetricFamily,
    read: _Read,
    by_pool: Mapping[PoolLabels, Sequence[ReplicaStats]],
) -> GaugeMetricFamily | CounterMetricFamily:
    for pool, replicas in sorted(by_pool.items()):
        totals: dict[str, float] = defaultdict(float)
        for replica in replicas:
            for tier in replica.kv_tiers:
                totals[tier.medium] += float(read(tier))
        for medium, value in sorted(totals.items()):
            family.add_metric([*pool, medium], value)
    return family
