"""Ray integration (marker ``ray``): the KV index split over two shard actors
(``routing.kv_index_shards: 2``). Two stand-in replicas publish to the shard that follows each,
the handle's router merges both shards, and a shard actor that is killed comes back (Ray
restarts it with a new epoch) and is refilled by its replicas' snapshots."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray import serve

from cluster.routing.kv_index.actor import (
    IndexPublisherFactory,
    get_or_create_index_actor,
    index_actor_name,
    kill_index_actor,
)
from cluster.routing.kv_index.follower import ActorIndexSource
from cluster.routing.kv_index.shard_assignment import shard_of
from cluster.routing.pool_router_config import request_router_config
from cluster.routing.routing_metrics import RoutingMetrics
from tests.cluster_fixtures import SimCluster
from tests.integration.routing_stand_ins import BLOCK_SIZE, FakePrefill, request, router_sees
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

APP = "routing-shards-it"
SHARDS = 2


@pytest.fixture(scope="module")
def handle(sim_cluster: SimCluster) -> Iterator[Any]:
    """Two stand-in replicas, each publishing to its shard; the router follows both."""
    try:
        deployment = serve.deployment(
            num_replicas=2,
            ray_actor_options={"num_cpus": 0},
            request_router_config=request_router_config(
                "prefill",
                "prefix_aware",
                block_size=BLOCK_SIZE,
                options={"poll_interval_s": 0.02, "index_shards": SHARDS},
            ),
        )(FakePrefill)
        factory = IndexPublisherFactory(pool="prefill", num_shards=SHARDS, heartbeat_s=0.2)
        yield serve.run(deployment.bind(factory), name=APP, route_prefix=None)
    finally:
        serve.delete(APP)
        kill_index_actor(APP)


def shard_holds(replica_id: str, num_blocks: int) -> bool:
    """The replica's shard lists it with ``num_blocks`` device blocks."""
    shard = get_or_create_index_actor(APP, shard=shard_of(replica_id, SHARDS), num_shards=SHARDS)
    snapshot = ray.get(shard.updates.remote(None, 0), timeout=10)["snapshot"]
    held = {item["replica_id"]: len(item["hashes"]) for item in snapshot["replicas"]}
    return held.get(replica_id) == num_blocks


def merged_view_holds(num_blocks: int) -> bool:
    """A fresh router-side view of both shards sees ``num_blocks`` of prefix 7 cached."""
    source = ActorIndexSource(APP, namespace="pdserve", metrics=RoutingMetrics(), num_shards=2)
    asyncio.run(source.sync_once())
    hashes = request(7, num_blocks)["routing"]["block_hashes"]
    return source.best_match("prefill", hashes) == num_blocks


def test_a_restarted_shard_is_refilled_and_routing_follows_it_again(handle: Any) -> None:
    holder, _ = handle.remote(request(7, 6)).result()
    wait_until(lambda: shard_holds(holder, 6), 30.0, "the holder's shard has its blocks")
    wait_until(router_sees(6), 30.0, "the handle's router merged both shards", poll_s=0.02)
    assert {handle.remote(request(7, 6)).result()[0] for _ in range(4)} == {holder}
    # Ray restarts the killed shard empty (a new epoch): the holder's pump resyncs it, and a
    # router's view reloads that shard alone
    shard = ray.get_actor(
        index_actor_name(APP, shard_of(holder, SHARDS), SHARDS), namespace="pdserve"
    )
    ray.kill(shard, no_restart=False)
    wait_until(lambda: shard_holds(holder, 6), 30.0, "the restarted shard is refilled")
    wait_until(lambda: merged_view_holds(6), 30.0, "a router's view has the prefix again")


def test_the_scale_harness_measures_lag_through_real_shards(sim_cluster: SimCluster) -> None:
    """``benchmarks/control_plane_scale.py``'s lag run, small: a pump fleet in its own actor,
    two shard actors, a router's view; every batch reaches the view."""
    from benchmarks.control_plane_scale import lag_run

    run = lag_run(4, 2, 1, [2000.0] * 4, 0.5, warm_s=0.2)
    assert run["batches_not_seen"] == 0 and run["calls_per_s"] > 0
    assert 0 < run["lag_p50_ms"] <= run["lag_p99_ms"] < 5000
