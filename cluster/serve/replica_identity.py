"""A replica's identity read from Ray Serve, inside the replica: the hook that keeps Ray out of
the roles (``replica.hooks.ReplicaIdentitySource``)."""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray import serve

from replica import ReplicaIdentity


@dataclass(frozen=True)
class ServeReplicaIdentity:
    """Serve's replica context (replica id, application) and the node's address."""

    def current(self) -> ReplicaIdentity:
        """This replica's identity (call inside a Serve replica)."""
        context = serve.get_replica_context()
        return ReplicaIdentity(
            replica_id=context.replica_id.unique_id,
            app_name=context.app_name,
            node_host=ray.util.get_node_ip_address(),
        )
