"""The cluster-wide KV index: which replica caches which block hash, in which tier.

``index`` is the pure data structure (``holders`` its storage and prefix walk), ``ops`` the
compact event form a replica sends, ``event_relay`` the replica-side feed, ``replication`` the
authoritative server and the routers' followers, ``follower`` the router-side copy kept current
in the background, ``actor`` the named Ray actor that hosts the server (import it from its
module: it needs Ray).
"""

from cluster.routing.kv_index.event_relay import IndexSink, KVEventPump, KVEventRelay
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.index import ApplyStatus, IndexStats, KVIndex
from cluster.routing.kv_index.ops import compact_events
from cluster.routing.kv_index.replication import KVIndexFollower, KVIndexServer

__all__ = [
    "ApplyStatus",
    "IndexSink",
    "IndexStats",
    "KVEventPump",
    "KVEventRelay",
    "KVIndex",
    "KVIndexFollower",
    "KVIndexServer",
    "TierHit",
    "compact_events",
]
