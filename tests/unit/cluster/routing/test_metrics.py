"""Routing metrics: per-pool decisions by reason, hit rate, latency buckets; index gauges."""

from __future__ import annotations

import json

from cluster.routing.kv_index.index import IndexStats
from cluster.routing.policy_types import RoutingDecision, RoutingReason
from cluster.routing.routing_metrics import RoutingMetrics, RoutingSnapshot, routing_metrics
from core.codec import to_plain


def decision(reason: RoutingReason, cached: int, prompt: int) -> RoutingDecision:
    return RoutingDecision("a", reason, ("a",), num_cached_blocks=cached, num_prompt_blocks=prompt)


def test_snapshot_counts_reasons_hit_rate_and_latency() -> None:
    metrics = RoutingMetrics()
    metrics.record_decision("prefill", decision(RoutingReason.CACHE_HIT, 6, 8), 0.0003)
    metrics.record_decision("prefill", decision(RoutingReason.LEAST_LOADED, 0, 8), 0.002)
    metrics.record_decision("decode", decision(RoutingReason.CACHE_HIT, 2, 2), 0.5)
    metrics.record_index(IndexStats(3, 1, 40, 25))
    snapshot = json.loads(json.dumps(to_plain(metrics.snapshot())))  # JSON-shaped as plain data
    prefill = snapshot["pools"]["prefill"]
    assert prefill["decisions_total"] == {"cache_hit": 1, "least_loaded": 1}
    assert prefill["prefix_hit_rate"] == 6 / 16
    latency = prefill["decision_latency_s"]
    assert latency["count"] == 2 and abs(latency["sum"] - 0.0023) < 1e-12
    assert latency["buckets"]["0.00025"] == 0
    assert latency["buckets"]["0.0005"] == 1
    assert latency["buckets"]["0.002"] == 2
    assert latency["buckets"]["+Inf"] == 2
    assert latency["p50"] == 0.002
    assert snapshot["pools"]["decode"]["decision_latency_s"]["buckets"]["0.1"] == 0
    assert snapshot["pools"]["decode"]["decision_latency_s"]["buckets"]["+Inf"] == 1
    assert snapshot["index"] == {
        "num_replicas": 3,
        "num_degraded_replicas": 1,
        "num_entries": 40,
        "num_hashes": 25,
    }
    metrics.reset()
    assert metrics.snapshot() == RoutingSnapshot(pools={}, index=None)


def test_the_process_has_one_metrics_object() -> None:
    assert routing_metrics() is routing_metrics()


def test_prefix_copies_add_up_per_pool_and_hot_is_a_gauge() -> None:
    metrics = RoutingMetrics()
    metrics.record_prefix_copies("decode", num_made=1, num_dropped=0, num_bytes=4096, num_hot=1)
    metrics.record_prefix_copies("decode", num_made=1, num_dropped=2, num_bytes=1024, num_hot=0)
    decode = metrics.snapshot().pools["decode"]
    assert (decode.prefix_copies_made_total, decode.prefix_copies_dropped_total) == (2, 2)
    assert (decode.prefix_copy_bytes_total, decode.hot_prefixes) == (5120, 0)
