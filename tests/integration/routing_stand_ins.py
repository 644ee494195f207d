"""Stand-in prefill replicas for the Ray routing tests: they only "cache" the blocks of the
prompts they receive and publish those as KV events (the engine's real message types) through
the index, so routing can be followed without engines. Shipped to Ray by value."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import ray
from ray import cloudpickle, serve

from cluster.routing.kv_index.actor import IndexPublisherFactory
from cluster.routing.routing_metrics import routing_metrics
from core.codec import from_plain, to_plain
from core.kv_events import BlockStored, KVEventBatch
from core.messages import PrefillRequest, RoutingKeys
from core.sampling import SamplingParams
from core.stats import RoutingStats

BLOCK_SIZE = 4
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FakePrefill:
    """Caches the blocks of every prompt it receives and says who it is."""

    def __init__(self, factory: IndexPublisherFactory) -> None:
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self.actor_name = str(ray.get_runtime_context().get_actor_name())
        self.publisher = factory.start(self.replica_id, context.app_name)
        self.seq = 0
        self.cached: set[int] = set()

    def __call__(self, request: dict[str, Any]) -> tuple[str, str]:
        routing = from_plain(PrefillRequest, request).routing
        hashes = [h for h in routing.block_hashes if h not in self.cached]
        if hashes:
            self.cached.update(hashes)
            event = BlockStored(hashes, None, [0] * BLOCK_SIZE * len(hashes), BLOCK_SIZE)
            self.publisher.callback(KVEventBatch(self.seq, [event]))
            self.seq += 1
        return self.replica_id, self.actor_name

    def record_routing_stats(self) -> dict[str, Any]:
        plain: dict[str, Any] = to_plain(RoutingStats(kv_blocks_free=100))
        return plain


def request(prefix: int, num_blocks: int) -> dict[str, Any]:
    """A prefill request of ``num_blocks`` blocks whose hashes are ``prefix * 100 + i``."""
    hashes = tuple(prefix * 100 + i for i in range(num_blocks))
    prompt = [0] * BLOCK_SIZE * num_blocks
    message = PrefillRequest(
        f"r{prefix}", prompt, SamplingParams(), RoutingKeys(hashes, len(prompt))
    )
    plain: dict[str, Any] = to_plain(message)
    return plain


def router_sees(num_entries: int) -> Callable[[], bool]:
    """The handle's router (in this process) synced an index of ``num_entries`` entries."""

    def synced() -> bool:
        index = routing_metrics().snapshot().index
        return index is not None and index.num_entries == num_entries

    return synced
