"""The routing metrics on /metrics: the hot-prefix gauge and copy counters per pool, and the
policy each pool ranks by."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cluster.routing.routing_metrics import routing_metrics
from cluster.serve.ingress_deployment import RoutingCollector


@pytest.fixture
def metrics() -> Iterator[None]:
    routing_metrics().reset()
    yield
    routing_metrics().reset()


@pytest.mark.usefixtures("metrics")
def test_hot_prefix_copies_render_per_pool() -> None:
    routing_metrics().record_prefix_copies(
        "decode", num_made=2, num_dropped=1, num_bytes=4096, num_hot=1
    )
    registry = CollectorRegistry()
    registry.register(RoutingCollector())
    text = generate_latest(registry).decode()
    assert 'pdserve:hot_prefixes{pool="decode"} 1.0' in text
    assert 'pdserve:prefix_copies_made_total{pool="decode"} 2.0' in text
    assert 'pdserve:prefix_copies_dropped_total{pool="decode"} 1.0' in text
    assert 'pdserve:prefix_copy_bytes_total{pool="decode"} 4096.0' in text


@pytest.mark.usefixtures("metrics")
def test_the_policy_each_pool_ranks_by_renders_as_a_gauge() -> None:
    routing_metrics().record_policy("prefill", "prefix_aware")
    routing_metrics().record_policy("decode", "prefix_aware")
    routing_metrics().record_policy("decode", "hot_prefix")  # changed in place
    registry = CollectorRegistry()
    registry.register(RoutingCollector())
    text = generate_latest(registry).decode()
    assert 'pdserve:routing_policy{policy="prefix_aware",pool="prefill"} 1.0' in text
    assert 'pdserve:routing_policy{policy="hot_prefix",pool="decode"} 1.0' in text
    assert 'policy="prefix_aware",pool="decode"' not in text
