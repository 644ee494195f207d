"""A hot prefix copied on purpose, live (marker ``ray``): in a side app whose decode pool has two
replicas, the ``hot_prefix`` router decides a copy of a prefix its holder serves too slowly, the
holder exports the blocks, the other replica pulls them over the KV transfer into its host tier,
and a request placed there onloads them instead of recomputing them.

Why the decision is certain (``cluster.routing.prefix_replication``): every prompt's uncached
part is above the local-prefill threshold, so the decode replicas never prefill and their
throughput is the configured prior, 4 tokens/s. A hit's service time is then the 48-token tail,
12 s; at the second request the prefix's rate reads well over 1/12 per second, so its one holder
is loaded past ``rho >= 1`` (or its M/D/1 wait exceeds the 20 s target) — rule 2; the idle other
replica would serve it in 0 + 12 s <= 20 s — rule 3. With the copy landed, a request whose
whole prompt the holder caches still goes to the copy while the holder streams a request of
128 uncached tokens: 32 s of queue there against (240 - 12 * 16 * (1 - 0.2)) / 4 = 21.6 s.
"""

from __future__ import annotations

import io
import json
from collections.abc import Generator, Iterator
from typing import Any

import httpx
import pytest
from ray import serve
from rich.console import Console

from cluster.ops.status_view import control_plane, render_hot_prefixes
from cluster.serve.config_file import load_cluster_config
from cluster.serve.pool_options import BOARD_DEPLOYMENT
from core.config import ClusterConfig
from core.hashing import hash_prompt_blocks
from tests.cluster_fixtures import ServingApp, side_app
from tests.integration import routing_support
from tests.integration.routing_support import cached_tokens, holders, tokens
from tests.integration.support import BLOCK_BYTES, SERVED_NAME, THRESHOLD_TOKENS, app_config
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HOT_APP = "pdserve-hot-prefix-test"
ROUTE = "/hot"
BLOCK_SIZE = 16
PREFIX_TOKENS = 12 * BLOCK_SIZE
TAIL_TOKENS = 3 * BLOCK_SIZE
LONG_TAIL_TOKENS = 8 * BLOCK_SIZE
assert TAIL_TOKENS > THRESHOLD_TOKENS
HOT_PREFIXES = {
    "prefill_tokens_per_s": 4.0,  # the prior: decode replicas that never prefill measure none
    "ttft_target_s": 20.0,
    "heat_half_life_s": 60.0,
    "min_copy_rate_per_s": 0.02,
    "retire_rate_per_s": 0.01,
    "max_copies_per_prefix": 1,
    "copy_interval_s": 30.0,
}


def hot_config(port: int) -> ClusterConfig:
    """One prefill replica; two decode replicas, each with a host tier a copy can land in."""
    return load_cluster_config(
        app_config(
            port,
            prefill={"num_cpus": 0.25},
            decode={
                "autoscaling": None,
                "num_replicas": 2,
                "num_cpus": 0.25,
                "engine": {"kv_tiers": {"host": {"bytes": 64 * BLOCK_BYTES}}},
            },
            routing={"policy": "hot_prefix", "hot_prefixes": HOT_PREFIXES},
            cluster={"address": "auto", "app_name": HOT_APP},
        )
    )


@pytest.fixture(scope="module")
def hot_app(serving_app: ServingApp) -> Iterator[str]:
    """The side app's endpoint (route ``/hot``), removed afterwards."""
    with side_app(serving_app, hot_config(serving_app.config.server.port), ROUTE) as endpoint:
        yield endpoint


def complete(endpoint: str, prompt: list[int]) -> dict[str, Any]:
    """A greedy four-token completion's body."""
    return routing_support.complete(endpoint, prompt, max_tokens=4)


def decode_holders(hashes: list[int], medium: str | None = None) -> set[str]:
    """Decode replicas caching every one of ``hashes`` (on ``medium``; None: anywhere)."""
    return holders(HOT_APP, hashes, "decode", medium)


def routers_in_sync() -> bool:
    """True when the ingress routers' index copy is as large as the index actor's."""
    return routing_support.routers_in_sync(HOT_APP)


def decode_stats() -> dict[str, dict[str, Any]]:
    """The decode replicas' latest stats on the side app's board, by replica id."""
    handle = serve.get_deployment_handle(BOARD_DEPLOYMENT, HOT_APP)
    reports: dict[str, list[dict[str, Any]]] = handle.snapshot.remote().result(timeout_s=30)
    return {r["replica_id"]: r["stats"] for r in reports.get("decode", [])}


def host_onloads(stats: dict[str, Any]) -> int:
    """Blocks a replica onloaded from its host tier so far."""
    return sum(t["onload_blocks_total"] for t in stats["kv_tiers"] if t["medium"] == "host")


def copy_counters(endpoint: str) -> dict[str, float]:
    """The decode pool's ``pdserve:prefix_cop*`` series on the side app's ``/metrics``."""
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    found = {}
    for line in text.splitlines():
        if line.startswith("pdserve:prefix_cop") and 'pool="decode"' in line:
            found[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found


def landed_counters(endpoint: str) -> dict[str, float]:
    """:func:`copy_counters` once bytes moved; empty before."""
    counters = copy_counters(endpoint)
    return counters if counters.get("pdserve:prefix_copy_bytes_total") else {}


def stream_long(endpoint: str, prompt: list[int]) -> Generator[str, None, None]:
    """A streamed greedy completion of many tokens; yields its SSE data lines (closing the
    generator closes the stream, which aborts the request)."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": 1024,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{endpoint}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                yield line


def test_a_hot_prefix_is_copied_to_the_other_replica_and_served_from_it(hot_app: str) -> None:
    endpoint = hot_app
    prefix = tokens(1, PREFIX_TOKENS)
    prefix_hashes = hash_prompt_blocks(prefix, BLOCK_SIZE)
    complete(endpoint, prefix + tokens(100, TAIL_TOKENS))
    (holder,) = wait_until(lambda: decode_holders(prefix_hashes), 30, "one decode holder")
    wait_until(routers_in_sync, 30, "the routers see the holder")
    assert all(s["prefill_tokens_total"] == 0 for s in decode_stats().values())

    # the second request of the prefix: the holder is too slow for its heat, a copy is made
    repeated = prefix + tokens(101, TAIL_TOKENS)
    reference = complete(endpoint, repeated)
    counters = wait_until(lambda: landed_counters(endpoint), 60, "the copy's bytes counted")
    assert counters["pdserve:prefix_copies_made_total"] == 1
    assert counters["pdserve:prefix_copy_bytes_total"] >= len(prefix_hashes) * BLOCK_BYTES
    assert counters.get("pdserve:prefix_copies_dropped_total", 0) == 0
    (target,) = wait_until(
        lambda: decode_holders(prefix_hashes, "host") - {holder}, 30, "the copy indexed on host"
    )
    wait_until(routers_in_sync, 30, "the routers see the copy")
    status = io.StringIO()
    render_hot_prefixes(control_plane(endpoint) or {}, Console(file=status, width=200))
    assert "hot prefixes: 1 copied now; copies made 1, dropped 0" in status.getvalue()

    # with the holder busy, the prompt it caches whole goes to the copy, which onloads it
    onloads_before = host_onloads(decode_stats()[target])
    busy = stream_long(endpoint, prefix + tokens(102, LONG_TAIL_TOKENS))
    try:
        for _ in range(3):  # past the first token: the decode replica streams now
            json.loads(next(busy).removeprefix("data: "))
        on_copy = complete(endpoint, repeated)
    finally:
        busy.close()
    assert on_copy["choices"][0]["text"] == reference["choices"][0]["text"]
    assert cached_tokens(on_copy) >= PREFIX_TOKENS
    wait_until(
        lambda: host_onloads(decode_stats()[target]) >= onloads_before + len(prefix_hashes),
        30,
        "the copy's replica onloaded the prefix from its host tier",
    )

    # nothing leaked: no block in use (requests done, the export's pin released)
    wait_until(
        lambda: all(s["kv_blocks_used"] == 0 for s in decode_stats().values()),
        60,
        "decode KV blocks released",
    )
