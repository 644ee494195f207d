"""What both roles' replicas share: one boot (spec + hooks), the lifecycle, the KV token and the
planner's signals."""

from replica.hooks import (
    GangEngineFactory,
    KVEventPublisher,
    KVEventPublisherFactory,
    KVTokenSource,
    LocalIdentity,
    ReplicaHooks,
    ReplicaIdentity,
    ReplicaIdentitySource,
    StatsReporter,
)
from replica.kv_token import KVToken
from replica.lifecycle import RoleReplica, RoleWorker
from replica.spec import ReplicaSpec, WorkerBoot

__all__ = [
    "GangEngineFactory",
    "KVEventPublisher",
    "KVEventPublisherFactory",
    "KVToken",
    "KVTokenSource",
    "LocalIdentity",
    "ReplicaHooks",
    "ReplicaIdentity",
    "ReplicaIdentitySource",
    "ReplicaSpec",
    "RoleReplica",
    "RoleWorker",
    "StatsReporter",
    "WorkerBoot",
]
