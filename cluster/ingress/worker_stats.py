"""Prometheus view of the replicas' :class:`~core.stats.ReplicaStats`, per role.

The ``/metrics`` handler fetches fresh stats from the app's ``stats_provider`` and hands them to
:meth:`WorkerStatsCollector.update`; the collector sums each field over the replicas of a role.
Transfer failures are labelled by reason (``ReplicaStats.transfer.failures_by_reason``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
        "pdserve:transfer_seconds",
        "Seconds spent in KV transfers.",
        lambda s: s.transfer.seconds_total,
    ),
    _Family("pdserve:transfers", "KV transfers finished.", lambda s: s.transfer.transfers_total),
)


class WorkerStatsCollector(Collector):
    """Holds the latest per-role replica stats and exposes their sums at each scrape."""

    def __init__(self) -> None:
        self._by_role: dict[str, list[ReplicaStats]] = {}

    def update(self, stats_by_role: Mapping[str, Sequence[ReplicaStats]]) -> None:
        """Replace the snapshot with ``role -> [stats of each live replica]``."""
        self._by_role = {role: list(replicas) for role, replicas in stats_by_role.items()}

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        replicas = GaugeMetricFamily(
            "pdserve:replicas", "Replicas that reported stats.", labels=["role"]
        )
        for role, stats in sorted(self._by_role.items()):
            replicas.add_metric([role], len(stats))
        yield replicas
        for family in _GAUGES:
            yield self._fill(GaugeMetricFamily(family.name, family.doc, labels=["role"]), family)
        for family in _COUNTERS:
            yield self._fill(CounterMetricFamily(family.name, family.doc, labels=["role"]), family)
        yield self._failures()

    def _fill(self, metric: _MetricT, family: _Family) -> _MetricT:
        for role, stats in sorted(self._by_role.items()):
            if stats:
                metric.add_metric([role], float(sum(family.read(s) for s in stats)))
        return metric

    def _failures(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "pdserve:transfer_failures", "KV transfers that failed.", labels=["role", "reason"]
        )
        for role, stats in sorted(self._by_role.items()):
            by_reason: Counter[str] = Counter()
            for s in stats:
                by_reason.update(s.transfer.failures_by_reason)
            for reason, value in sorted(by_reason.items()):
                family.add_metric([role, reason], value)
        return family
