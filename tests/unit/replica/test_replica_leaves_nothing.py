"""A replica that goes (upgrade, scale-down, ``pdserve down``, Serve's own shutdown) leaves
nothing behind: Serve's stop hook frees the engine, which unlinks the prefill's shared KV
segment in ``/dev/shm`` — also when the drain before it fails. The replica publishes its KV
fingerprint in its stats and in the routing stats its routers pair by."""

from __future__ import annotations

import asyncio
import os

import pytest

from core.codec import from_plain
from core.config import TransferConfig
from core.shared_memory import SHM_DIR
from core.stats import RoutingStats
from prefill.deployment import PrefillDeployment
from replica import ReplicaSpec
from tests.unit.engine.async_engine.tiny_engine import ENGINE, MODEL

pytestmark = pytest.mark.timeout(60)

SPEC = ReplicaSpec(
    role="prefill",
    model=MODEL,
    engine=ENGINE,
    transfer=TransferConfig(bind_host="127.0.0.1", insecure_test_token="leaves-nothing"),
)


def _segment_path(replica: PrefillDeployment) -> str:
    name = replica.worker.engine.engine.parts.storage.shared_region
    assert name is not None  # same-node transfers on: the KV's host bytes are shared
    return os.path.join(SHM_DIR, name)


def test_serves_stop_unlinks_the_replicas_segment_and_its_stats_name_its_fingerprint() -> None:
    replica = PrefillDeployment(SPEC)
    path = _segment_path(replica)
    assert os.path.exists(path)
    fingerprint = replica.replica_stats().kv_fingerprint
    assert len(fingerprint) == 16
    routing = from_plain(RoutingStats, replica.record_routing_stats())
    assert routing.kv_fingerprint == fingerprint
    stop = replica.__del__()
    assert stop is not None
    asyncio.run(stop)
    assert not os.path.exists(path)


def test_a_failed_drain_still_frees_the_engine_and_its_segment() -> None:
    replica = PrefillDeployment(SPEC)
    path = _segment_path(replica)

    async def failing_drain(timeout_s: float) -> int:
        raise RuntimeError("drain broke")

    replica.worker.drain = failing_drain  # type: ignore[method-assign]
    stop = replica.__del__()
    assert stop is not None
    with pytest.raises(RuntimeError, match="drain broke"):
        asyncio.run(stop)
    assert not os.path.exists(path)
    assert not replica.worker.engine.is_running()
