"""Prometheus view of the replicas' :class:`~core.stats.ReplicaStats`, per model and role.

The ``/metrics`` handler fetches fresh stats from the app's ``stats_provider`` (pool -> replica
id -> stats) and hands them to :meth:`WorkerStatsCollector.update`; gauges sum each field over
the live replicas of a pool. Transfer failures are labelled by reason, pulls by path.

Counters never go down. A replica's counters start at zero in its process, so a sum over live
replicas alone drops when one dies or is replaced. The collector therefore keeps the last stats
of every replica id that stopped reporting and adds them to the counters (a replica id that comes
back is live again and counted once). Serve gives a restarted replica a new id, so its fresh
counters add to the dead one's instead of replacing them. One Ingress replica only retires what
it saw; behind several, each one's series is monotonic on its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cluster.ingress.telemetry.lora_metrics import lora_families
from cluster.ingress.telemetry.tier_metrics import PoolLabels, tier_families
from core.config import split_pool_key
from core.stats import ReplicaStats

_MetricT = TypeVar("_MetricT", GaugeMetricFamily, CounterMetricFamily)
_LABELS = ["model_name", "role"]


@dataclass(frozen=True)
class _Family:
    name: str
    doc: str
    read: Callable[[ReplicaStats], float]


_GAUGES: tuple[_Family, ...] = (
    _Family("pdserve:kv_blocks_used", "KV blocks in use.", lambda s: s.kv_blocks_used),
    _Family("pdserve:kv_blocks_free", "KV blocks free.", lambda s: s.kv_blocks_free),
    _Family("pdserve:kv_blocks_total", "KV blocks in the cache.", lambda s: s.kv_blocks_total),
    _Family(
        "pdserve:num_requests_running",
        "Requests in the engines' running batch.",
        lambda s: s.num_running,
    ),
    _Family(
        "pdserve:num_requests_waiting",
        "Requests waiting in the engines' queue.",
        lambda s: s.num_waiting,
    ),
    _Family(
        "pdserve:transfer_in_flight", "KV transfers in progress.", lambda s: s.transfer.in_flight
    ),
    _Family(
        "pdserve:kv_exports_pinned", "KV exports pinned under a lease.", lambda s: s.exports_pinned
    ),
)

_COUNTERS: tuple[_Family, ...] = (
    _Family("pdserve:transfer_bytes", "KV bytes transferred.", lambda s: s.transfer.bytes_total),
    _Family(
        "pdserve:kv_leases_expired",
        "KV exports freed because their lease expired (no pull, heartbeat or release in time).",
        lambda s: s.transfer.leases_expired_total,
    ),
    _Family(
        "pdserve:transfer_unauthenticated_calls",
        "KV transfer calls refused for a missing or wrong auth token.",
        lambda s: s.transfer.unauthenticated_calls_total,
    ),
    _Family(
        "pdserve:replica_requests", "Calls the role replicas received.", lambda s: s.requests_total
    ),
    _Family(
        "pdserve:transfer_seconds",
        "Seconds spent in KV transfers.",
        lambda s: s.transfer.seconds_total,
    ),
    _Family("pdserve:transfers", "KV transfers finished.", lambda s: s.transfer.transfers_total),
    _Family(
        "pdserve:decode_handoffs",
        "Requests a leaving decode replica stopped and handed off, their blocks exported.",
        lambda s: s.handoffs_total,
    ),
    _Family(
        "pdserve:decode_handoff_blocks_pulled",
        "KV blocks decode replicas pulled for requests another one handed off.",
        lambda s: s.handoff_blocks_pulled_total,
    ),
    _Family(
        "pdserve:spec_decode_num_drafts",
        "Verify rows run by speculative decoding (vLLM's spec_decode_num_drafts).",
        lambda s: s.spec_decode.num_drafts,
    ),
    _Family(
        "pdserve:spec_decode_num_draft_tokens",
        "Draft tokens verified (vLLM's spec_decode_num_draft_tokens).",
        lambda s: s.spec_decode.num_draft_tokens,
    ),
    _Family(
        "pdserve:spec_decode_num_accepted_tokens",
        "Draft tokens accepted (vLLM's spec_decode_num_accepted_tokens).",
        lambda s: s.spec_decode.num_accepted_tokens,
    ),
)


class WorkerStatsCollector(Collector):
    """Holds the latest per-pool replica stats and exposes their sums at each scrape, labelled
    ``model_name`` and ``role``."""

    def __init__(self, model_name: str = "") -> None:
        self._model_name = model_name  # the label of a one-model cluster's pools
        self._by_pool: dict[PoolLabels, dict[str, ReplicaStats]] = {}
        self._gone: dict[PoolLabels, dict[str, ReplicaStats]] = {}
        """pool -> replica id -> last stats of a replica that stopped reporting."""

    def update(self, stats_by_pool: Mapping[str, Mapping[str, ReplicaStats]]) -> None:
        """Replace the snapshot with ``pool -> replica id -> stats`` of the live replicas (pools
        named by ``core.config.pool_key``); the replicas missing from it keep counting in the
        counters."""
        fresh = {self._labels(key): dict(stats) for key, stats in stats_by_pool.items()}
        for pool, previous in self._by_pool.items():
            live = fresh.get(pool, {})
            gone = self._gone.setdefault(pool, {})
            gone.update((rid, stats) for rid, stats in previous.items() if rid not in live)
        self._by_pool = fresh
        for pool, live in self._by_pool.items():
            for replica_id in live:
                self._gone.get(pool, {}).pop(replica_id, None)

    def _labels(self, key: str) -> PoolLabels:
        role, scope = split_pool_key(key)
        return scope or self._model_name, role

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        replicas = GaugeMetricFamily(
            "pdserve:replicas", "Replicas that reported stats.", labels=_LABELS
        )
        for pool, stats in sorted(self._by_pool.items()):
            replicas.add_metric(list(pool), len(stats))
        yield replicas
        live = {pool: list(stats.values()) for pool, stats in self._by_pool.items()}
        ever = {
            pool: [*live.get(pool, []), *self._gone.get(pool, {}).values()]
            for pool in set(self._by_pool) | set(self._gone)
        }
        for family in _GAUGES:
            yield _fill(GaugeMetricFamily(family.name, family.doc, labels=_LABELS), family, live)
        for family in _COUNTERS:
            metric = CounterMetricFamily(family.name, family.doc, labels=_LABELS)
            yield _fill(metric, family, ever)
        for labelled in _LABELLED_COUNTERS:
            yield _labelled(labelled, ever)
        yield from tier_families(live, ever)
        yield from lora_families(self._by_pool)


def _fill(
    metric: _MetricT, family: _Family, by_pool: Mapping[PoolLabels, Sequence[ReplicaStats]]
) -> _MetricT:
    for pool, stats in sorted(by_pool.items()):
        if stats:
            metric.add_metric(list(pool), float(sum(family.read(s) for s in stats)))
    return metric


@dataclass(frozen=True)
class _LabelledFamily:
    name: str
    doc: str
    label: str
    read: Callable[[ReplicaStats], Mapping[str, int]]


_LABELLED_COUNTERS: tuple[_LabelledFamily, ...] = (
    _LabelledFamily(
        "pdserve:transfer_failures",
        "KV transfers that failed.",
        "reason",
        lambda s: s.transfer.failures_by_reason,
    ),
    _LabelledFamily(
        "pdserve:kv_transfer_pulls",
        "KV pulls by the path that moved their bytes (grpc, same_node).",
        "path",
        lambda s: s.transfer.pulls_by_path,
    ),
    _LabelledFamily(
        "pdserve:kv_same_node_fallbacks",
        "KV pulls that went over gRPC instead of the same-node path, by why "
        "(off, no_region, other_node, unmapped).",
        "reason",
        lambda s: s.transfer.same_node_fallbacks_by_reason,
    ),
    _LabelledFamily(
        "pdserve:spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted by their position in the draft, 0 first (vLLM's "
        "spec_decode_num_accepted_tokens_per_pos).",
        "position",
        lambda s: {str(i): n for i, n in enumerate(s.spec_decode.num_accepted_tokens_per_pos)},
    ),
)


def _labelled(
    family: _LabelledFamily, by_pool: Mapping[PoolLabels, Sequence[ReplicaStats]]
) -> CounterMetricFamily:
    metric = CounterMetricFamily(family.name, family.doc, labels=[*_LABELS, family.label])
    for pool, stats in sorted(by_pool.items()):
        by_label: Counter[str] = Counter()
        for s in stats:
            by_label.update(family.read(s))
        for label, value in sorted(by_label.items()):
            metric.add_metric([*pool, label], value)
    return metric
