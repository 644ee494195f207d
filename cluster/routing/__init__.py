"""The prefix-aware scheduler: KV index, routing policies, Serve request routers.

Only the Ray-free parts are re-exported here, so importing them never pulls in Ray. The Ray
parts are imported from their modules: ``cluster.routing.pool_router_config``
(``request_router_config``), ``cluster.routing.serve_router`` (the router classes) and
``cluster.routing.kv_index.actor`` (the index actor and ``IndexPublisherFactory``).
"""

from cluster.routing.kv_index.compaction import compact_events
from cluster.routing.kv_index.event_relay import IndexSink, KVEventPump, KVEventRelay
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.index import ApplyStatus, IndexStats, KVIndex
from cluster.routing.kv_index.replication import KVIndexFollower, KVIndexServer
from cluster.routing.load_tracker import LoadTracker
from cluster.routing.policies import (
    LeastLoadedPolicy,
    PrefixAwarePolicy,
    RoundRobinPolicy,
    choose_least_loaded,
    choose_prefix_aware,
    choose_round_robin,
)
from cluster.routing.policy_registry import (
    BUILTIN_POLICY_NAMES,
    RoutingPolicy,
    make_policy,
    policy_names,
    register_policy,
)
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    PoolRole,
    ReplicaLoad,
    RoutingDecision,
    RoutingInputs,
    RoutingReason,
    SessionPin,
)
from cluster.routing.request_features import read_routing_keys
from cluster.routing.router_kwargs import RouterSettings
from cluster.routing.routing_metrics import RoutingMetrics, routing_metrics
from cluster.routing.sessions import SessionAffinity, extract_session_id

__all__ = [
    "BUILTIN_POLICY_NAMES",
    "ApplyStatus",
    "CostWeights",
    "HotSpotConfig",
    "IndexSink",
    "IndexStats",
    "KVEventPump",
    "KVEventRelay",
    "KVIndex",
    "KVIndexFollower",
    "KVIndexServer",
    "LeastLoadedPolicy",
    "LoadTracker",
    "PoolRole",
    "PrefixAwarePolicy",
    "ReplicaLoad",
    "RoundRobinPolicy",
    "RouterSettings",
    "RoutingDecision",
    "RoutingInputs",
    "RoutingMetrics",
    "RoutingPolicy",
    "RoutingReason",
    "SessionAffinity",
    "SessionPin",
    "TierHit",
    "choose_least_loaded",
    "choose_prefix_aware",
    "choose_round_robin",
    "compact_events",
    "extract_session_id",
    "make_policy",
    "policy_names",
    "read_routing_keys",
    "register_policy",
    "routing_metrics",
]
