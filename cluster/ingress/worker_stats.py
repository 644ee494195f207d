"""Prometheus view of the replicas' :class:`~core.stats.ReplicaStats`, per role.

The ``/metrics`` handler fetches fresh stats from the app's ``stats_provider`` (role -> replica
id -> stats) and hands them to :meth:`WorkerStatsCollector.update`; gauges sum each field over
the live replicas of a role. Transfer failures are labelled by reason.

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

from cluster.ingress.tier_metrics import tier_families
from core.stats import ReplicaStats

_MetricT = TypeVar("_MetricT", GaugeMetricFamily, CounterMetricFamily)


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
)


class WorkerStatsCollector(Collector):
    """Holds the latest per-role replica stats and exposes their sums at each scrape."""

    def __init__(self) -> None:
        self._by_role: dict[str, dict[str, ReplicaStats]] = {}
        self._gone: dict[str, dict[str, ReplicaStats]] = {}
        """role -> replica id -> last stats of a replica that stopped reporting."""

    def update(self, stats_by_role: Mapping[str, Mapping[str, ReplicaStats]]) -> None:
        """Replace the snapshot with ``role -> replica id -> stats`` of the live replicas; the
        replicas missing from it keep counting in the counters."""
        for role, previous in self._by_role.items():
            live = stats_by_role.get(role, {})
            gone = self._gone.setdefault(role, {})
            gone.update((rid, stats) for rid, stats in previous.items() if rid not in live)
        self._by_role = {role: dict(replicas) for role, replicas in stats_by_role.items()}
        for role, live in self._by_role.items():
            for replica_id in live:
                self._gone.get(role, {}).pop(replica_id, None)

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        replicas = GaugeMetricFamily(
            "pdserve:replicas", "Replicas that reported stats.", labels=["role"]
        )
        for role, stats in sorted(self._by_role.items()):
            replicas.add_metric([role], len(stats))
        yield replicas
        live = {role: list(stats.values()) for role, stats in self._by_role.items()}
        ever = {
            role: [*live.get(role, []), *self._gone.get(role, {}).values()]
            for role in self._roles()
        }
        for family in _GAUGES:
            yield _fill(GaugeMetricFamily(family.name, family.doc, labels=["role"]), family, live)
        for family in _COUNTERS:
            metric = CounterMetricFamily(family.name, family.doc, labels=["role"])
            yield _fill(metric, family, ever)
        yield _failures(ever)
        yield from tier_families(live, ever)

    def _roles(self) -> set[str]:
        return set(self._by_role) | set(self._gone)


def _fill(
    metric: _MetricT, family: _Family, by_role: Mapping[str, Sequence[ReplicaStats]]
) -> _MetricT:
    for role, stats in sorted(by_role.items()):
        if stats:
            metric.add_metric([role], float(sum(family.read(s) for s in stats)))
    return metric


def _failures(by_role: Mapping[str, Sequence[ReplicaStats]]) -> CounterMetricFamily:
    family = CounterMetricFamily(
        "pdserve:transfer_failures", "KV transfers that failed.", labels=["role", "reason"]
    )
    for role, stats in sorted(by_role.items()):
        by_reason: Counter[str] = Counter()
        for s in stats:
            by_reason.update(s.transfer.failures_by_reason)
        for reason, value in sorted(by_reason.items()):
            family.add_metric([role, reason], value)
    return family
