"""The cluster-wide KV index: which replica caches which block hash, in which tier.

``index`` is the pure data structure (``holders`` its storage and prefix walk), ``compaction``
turns engine events into the compact ops a replica sends (the messages themselves are
``core.kv_index_messages``), ``event_relay`` the replica-side feed, ``stream`` its binary
stream to the shard, ``replication`` the authoritative server and the routers' followers,
``shard_assignment`` which shard follows which replica, ``follower`` the router-side copy kept
current in the background, ``actor`` the named Ray actor that hosts the server (import it from
its module: it needs Ray), ``fingerprints`` the separate view per KV fingerprint (a request is
placed, and its prefix hits counted, only among replicas of its fingerprint).
"""

from cluster.routing.kv_index.compaction import compact_events
from cluster.routing.kv_index.event_relay import IndexSink, KVEventPump, KVEventRelay
from cluster.routing.kv_index.fingerprints import of_fingerprint
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.index import ApplyStatus, IndexStats, KVIndex
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
    "of_fingerprint",
]
