"""What both roles' replicas share: the lifecycle and the hooks the composition root hands in."""

from replica.hooks import (
    GangEngineFactory,
    KVEventPublisher,
    KVEventPublisherFactory,
    StatsReporter,
)
from replica.lifecycle import RoleReplica, RoleWorker

__all__ = [
    "GangEngineFactory",
    "KVEventPublisher",
    "KVEventPublisherFactory",
    "RoleReplica",
    "RoleWorker",
    "StatsReporter",
]
