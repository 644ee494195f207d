"""Ray integration (marker ``ray``): two Serve replicas publishing KV events through the index
actor, a handle routed by ``PrefixAwareRequestRouter``.

Requests sharing a prefix go to the replica that holds it; a replica that leaves is dropped
from the index and routing continues on the other one. The replicas are stand-ins that only
"cache" the blocks of the prompts they receive (the events are the engine's real message
types); the real engines are wired by the serving deployments.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray import cloudpickle, serve

from cluster.routing.kv_index.actor import (
    IndexPublisherFactory,
    get_or_create_index_actor,
    kill_index_actor,
)
from cluster.routing.pool_router_config import request_router_config
from cluster.routing.routing_metrics import routing_metrics
from tests.cluster_fixtures import SimCluster
from tests.integration.routing_stand_ins import BLOCK_SIZE, FakePrefill, request, router_sees
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

APP = "routing-it"
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def handle(sim_cluster: SimCluster) -> Iterator[Any]:
    """The stand-in app on the suite's shared cluster (beside the shared pdserve app)."""
    try:
        deployment = serve.deployment(
            num_replicas=2,
            ray_actor_options={"num_cpus": 0},
            request_router_config=request_router_config(
                "prefill", "prefix_aware", block_size=BLOCK_SIZE, options={"poll_interval_s": 0.02}
            ),
        )(FakePrefill)
        yield serve.run(
            deployment.bind(IndexPublisherFactory(pool="prefill")), name=APP, route_prefix=None
        )
    finally:
        serve.delete(APP)
        kill_index_actor(APP)


def index_replicas() -> set[str]:
    actor = get_or_create_index_actor(APP)
    update = ray.get(actor.updates.remote(None, 0))
    return {item["replica_id"] for item in update["snapshot"]["replicas"]}


def test_shared_prefixes_follow_the_cache_and_survive_a_replica_leaving(handle: Any) -> None:
    holder, holder_actor = handle.remote(request(1, 6)).result()
    wait_until(router_sees(6), 30.0, "router sees 6 blocks", poll_s=0.05)
    chosen = {handle.remote(request(1, 8)).result()[0] for _ in range(6)}
    assert chosen == {holder}  # the holder now caches 8 blocks of prefix 1
    wait_until(router_sees(8), 30.0, "router sees 8 blocks", poll_s=0.05)
    decisions = routing_metrics().snapshot().pools["prefill"].decisions_total
    assert decisions.get("cache_hit", 0) >= 5
    # the holder dies: Serve drops it, the router removes it from the index, routing goes on
    ray.kill(ray.get_actor(holder_actor, namespace="serve"), no_restart=True)
    wait_until(lambda: holder not in index_replicas(), 30.0, "replica left the index", poll_s=0.05)
    survivors = {handle.remote(request(1, 8)).result()[0] for _ in range(3)}
    assert holder not in survivors
