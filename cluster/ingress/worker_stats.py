"""Prometheus view of the workers' ``stats()`` dicts, per role (KV blocks, transfers, queues).

The ``/metrics`` handler fetches fresh stats from the deploy helper's ``stats_provider`` and
hands them to :meth:`WorkerStatsCollector.update`; the collector sums each key over the replicas
of a role. Failures by reason come from keys ``transfer_failures_<reason>_total``; without any
such key, ``transfer_failures_total`` is exposed with ``reason="all"``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cluster.ingress.clients import WorkerStats

_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("kv_blocks_used", "pdserve:kv_blocks_used", "KV blocks in use."),
    ("kv_blocks_free", "pdserve:kv_blocks_free", "KV blocks free."),
    ("kv_blocks_total", "pdserve:kv_blocks_total", "KV blocks in the cache."),
    ("num_running", "pdserve:num_requests_running", "Requests in the engines' running batch."),
    ("num_waiting", "pdserve:num_requests_waiting", "Requests waiting in the engines' queue."),
    ("transfers_in_flight", "pdserve:transfer_in_flight", "KV transfers in progress."),
    ("exports_pinned", "pdserve:kv_exports_pinned", "KV exports pinned under a lease."),
)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("transfer_bytes_total", "pdserve:transfer_bytes", "KV bytes transferred."),
    ("transfer_seconds_total", "pdserve:transfer_seconds", "Seconds spent in KV transfers."),
    ("transfers_total", "pdserve:transfers", "KV transfers finished."),
)
_FAILURE_PREFIX = "transfer_failures_"
_FAILURE_SUFFIX = "_total"
_FAILURES_TOTAL = "transfer_failures_total"


class WorkerStatsCollector(Collector):
    """Holds the latest per-role sums and exposes them at each scrape."""

    def __init__(self) -> None:
        self._sums: dict[str, dict[str, float]] = {}
        self._num_replicas: dict[str, int] = {}

    def update(self, stats_by_role: Mapping[str, Sequence[WorkerStats]]) -> None:
        """Replace the snapshot with ``role -> [stats() of each replica]``."""
        sums: dict[str, dict[str, float]] = {}
        for role, replicas in stats_by_role.items():
            totals: dict[str, float] = defaultdict(float)
            for stats in replicas:
                for key, value in stats.items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        totals[key] += float(value)
            sums[role] = dict(totals)
        self._sums = sums
        self._num_replicas = {role: len(replicas) for role, replicas in stats_by_role.items()}

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        replicas = GaugeMetricFamily(
            "pdserve:replicas", "Replicas that reported stats.", labels=["role"]
        )
        for role, count in sorted(self._num_replicas.items()):
            replicas.add_metric([role], count)
        yield replicas
        for key, name, doc in _GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["role"])
            self._fill(gauge, key)
            yield gauge
        for key, name, doc in _COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=["role"])
            self._fill(counter, key)
            yield counter
        yield self._failures()

    def _fill(self, family: GaugeMetricFamily | CounterMetricFamily, key: str) -> None:
        for role, totals in sorted(self._sums.items()):
            if key in totals:
                family.add_metric([role], totals[key])

    def _failures(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "pdserve:transfer_failures", "KV transfers that failed.", labels=["role", "reason"]
        )
        for role, totals in sorted(self._sums.items()):
            by_reason = {
                key[len(_FAILURE_PREFIX) : -len(_FAILURE_SUFFIX)]: value
                for key, value in totals.items()
                if key.startswith(_FAILURE_PREFIX)
                and key.endswith(_FAILURE_SUFFIX)
                and key != _FAILURES_TOTAL
            }
            if not by_reason and _FAILURES_TOTAL in totals:
                by_reason = {"all": totals[_FAILURES_TOTAL]}
            for reason, value in sorted(by_reason.items()):
                family.add_metric([role, reason], value)
        return family
