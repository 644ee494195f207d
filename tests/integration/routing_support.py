"""What the live routing tests read of a running app: token-id prompts, greedy completions, the
app's KV index rows and whether the ingress routers caught up with it.

Prompts are token-id lists (vocabulary 320) so block boundaries are exact.
"""

from __future__ import annotations

from typing import Any

import httpx
import ray
from ray import serve

from cluster.routing.kv_index.actor import get_or_create_index_actor
from cluster.routing.routing_metrics import RoutingSnapshot
from cluster.serve.pool_options import INGRESS_DEPLOYMENT
from core.codec import from_plain
from tests.integration.support import SERVED_NAME


def tokens(seed: int, num_tokens: int) -> list[int]:
    """A deterministic token-id sequence (ids 10..309)."""
    return [10 + (seed * 131 + i * 7) % 300 for i in range(num_tokens)]


def complete(
    endpoint: str, prompt: list[int], *, max_tokens: int = 2, session_id: str = ""
) -> dict[str, Any]:
    """A greedy completion's response body (asserts 200)."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    headers = {"x-session-id": session_id} if session_id else {}
    response = httpx.post(f"{endpoint}/v1/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def cached_tokens(result: dict[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a completion."""
    return int(result["usage"]["prompt_tokens_details"]["cached_tokens"])


def index_rows(app_name: str) -> dict[str, dict[str, Any]]:
    """The app's KV index (``export_index`` rows) by replica id."""
    actor = get_or_create_index_actor(app_name)
    update = ray.get(actor.updates.remote(None, 0), timeout=30)
    return {row["replica_id"]: row for row in update["snapshot"]["replicas"]}


def holders(app_name: str, hashes: list[int], pool: str, medium: str | None = None) -> set[str]:
    """Replicas of ``pool`` (healthy in the index) caching every one of ``hashes`` (on
    ``medium``; None: on any tier)."""
    found = set()
    for replica_id, row in index_rows(app_name).items():
        cached = row["hashes"] if medium is None else row["tiers"].get(medium, [])
        if row["pool"] == pool and not row["degraded"] and set(hashes) <= set(cached):
            found.add(replica_id)
    return found


def routing_snapshot(app_name: str) -> RoutingSnapshot:
    """The app's ingress routing metrics."""
    handle = serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name)
    return from_plain(RoutingSnapshot, handle.routing_snapshot.remote().result(timeout_s=30))


def routers_in_sync(app_name: str) -> bool:
    """True when the ingress routers' index copy is as large as the index actor's."""
    actor = get_or_create_index_actor(app_name)
    num_entries = ray.get(actor.stats.remote(), timeout=30)["num_entries"]
    index = routing_snapshot(app_name).index
    return index is not None and index.num_entries == num_entries
