"""The prefix-aware scheduler inside the running app (marker ``ray``): real engines publish KV
events to the app's index actor, the Serve routers follow it.

Prompts are token-id lists (vocabulary 320) so the block boundaries are exact: a long shared
prefix plus a unique tail longer than the local-prefill threshold, so every request prefills
remotely even when decode caches the prefix.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import ray
from ray import serve

from cluster.ops.scaling import scale
from cluster.routing.kv_index.actor import get_or_create_index_actor
from cluster.serve.pool_options import DECODE_DEPLOYMENT
from core.hashing import hash_prompt_blocks
from tests.cluster_fixtures import ServingApp, SimCluster
from tests.integration import routing_support
from tests.integration.routing_support import cached_tokens, index_rows, routing_snapshot, tokens
from tests.integration.support import APP_NAME, THRESHOLD_TOKENS
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

BLOCK_SIZE = 16
PREFIX_TOKENS = 12 * BLOCK_SIZE
TAIL_TOKENS = 3 * BLOCK_SIZE
assert TAIL_TOKENS > THRESHOLD_TOKENS


def complete(app: ServingApp, prompt: list[int], session_id: str = "") -> dict[str, Any]:
    """A greedy two-token completion's response body."""
    return routing_support.complete(app.endpoint, prompt, session_id=session_id)


def index_replicas() -> dict[str, dict[str, Any]]:
    """The index actor's replicas (``export_index`` rows) by replica id."""
    return index_rows(APP_NAME)


def decode_import_bytes() -> int:
    """Bytes the (single) decode replica pulled so far, read from the worker itself."""
    handle = serve.get_deployment_handle(DECODE_DEPLOYMENT, APP_NAME)
    stats: dict[str, Any] = handle.stats.remote().result(timeout_s=30)
    return int(stats["transfer"]["bytes_total"])


def holders(hashes: list[int], pool: str) -> set[str]:
    """Replicas of ``pool`` (healthy in the index) caching every one of ``hashes``."""
    return routing_support.holders(APP_NAME, hashes, pool)


def routers_in_sync() -> bool:
    """True when the ingress routers' index copy is as large as the index actor's."""
    return routing_support.routers_in_sync(APP_NAME)


def test_forced_gap_resyncs_and_second_turn_pulls_fewer_blocks(app: ServingApp) -> None:
    turn_1 = tokens(1, PREFIX_TOKENS + TAIL_TOKENS)
    before = decode_import_bytes()
    complete(app, turn_1, session_id="conversation-1")
    turn_1_bytes = decode_import_bytes() - before
    assert turn_1_bytes > 0, "the first turn's KV came from the prefill pool"
    hashes = hash_prompt_blocks(turn_1, BLOCK_SIZE)
    wait_until(lambda: holders(hashes, "decode"), 30, "decode's cache is in the index")

    # second turn: the whole first exchange (an answer, then a new user turn) as the prompt
    turn_2 = turn_1 + tokens(2, 2) + tokens(3, TAIL_TOKENS)
    before = decode_import_bytes()
    second = complete(app, turn_2, session_id="conversation-1")
    turn_2_bytes = decode_import_bytes() - before
    assert 0 < turn_2_bytes < turn_1_bytes / 2, (turn_1_bytes, turn_2_bytes)
    assert cached_tokens(second) >= len(turn_1) - BLOCK_SIZE

    # a gap in a prefill replica's event sequence: degraded, then resynced by the worker
    (replica_id,) = holders(hashes, "prefill")
    actor = get_or_create_index_actor(APP_NAME)
    gap = {"replica_seq": 10**15, "ops": []}
    assert ray.get(actor.publish.remote(replica_id, [gap]), timeout=30) == {"resync": True}
    assert index_replicas()[replica_id]["degraded"]
    wait_until(lambda: replica_id in holders(hashes, "prefill"), 30, "the replica resynced")
    assert index_replicas()[replica_id]["last_seq"] < 10**15
    wait_until(lambda: routing_snapshot(APP_NAME).index.num_degraded_replicas == 0, 30, "routers")  # type: ignore[union-attr]


def test_shared_prefix_follows_its_replica_and_survives_its_death(
    app: ServingApp, sim_cluster: SimCluster
) -> None:
    scale(APP_NAME, 2, None, dashboard_url=sim_cluster.dashboard_url)
    wait_until(lambda: len(app.board().get("prefill", [])) == 2, 120, "two prefill replicas")
    wait_until(lambda: len(app.running_replicas("Prefill")) == 2, 60, "both running")
    prefix = tokens(4, PREFIX_TOKENS)
    prefix_hashes = hash_prompt_blocks(prefix, BLOCK_SIZE)
    complete(app, prefix + tokens(100, TAIL_TOKENS))
    (holder,) = wait_until(lambda: holders(prefix_hashes, "prefill"), 30, "one holder indexed")
    wait_until(routers_in_sync, 30, "the routers synced")

    decisions_before = routing_snapshot(APP_NAME).pools["prefill"].decisions_total
    for i in range(4):
        result = complete(app, prefix + tokens(101 + i, TAIL_TOKENS))
        assert cached_tokens(result) >= PREFIX_TOKENS, f"request {i} missed the prefix holder"
    assert holders(prefix_hashes, "prefill") == {holder}, "the prefix never moved"
    decisions = routing_snapshot(APP_NAME).pools["prefill"].decisions_total
    assert decisions.get("cache_hit", 0) >= decisions_before.get("cache_hit", 0) + 4
    metrics = httpx.get(app.url("/metrics"), timeout=30).text
    assert 'pdserve:routing_decisions_total{pool="prefill",reason="cache_hit"}' in metrics

    # the holder dies: it leaves the index and requests keep succeeding on the other replica
    (victim,) = [r for r in app.board()["prefill"] if r["replica_id"] == holder]
    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
    wait_until(lambda: holder not in index_replicas(), 60, "the dead replica left the index")
    for i in range(3):
        complete(app, prefix + tokens(200 + i, TAIL_TOKENS))
    wait_until(lambda: holders(prefix_hashes, "prefill") - {holder}, 30, "a new holder")
