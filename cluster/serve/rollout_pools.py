"""The root of a rolling upgrade's second app: the new version's pools, and nothing else.

Serve deploys what an app's root binds, so this tiny deployment (one replica, no CPU) holds the
handles of the new version's Prefill and Decode deployments; it serves no request. The pools'
replicas report to the running app's stats board and KV index (the app builder's
:func:`~cluster.serve.app_builder.build_pools_app_from_config`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

ROLLOUT_ROOT_DEPLOYMENT = "RolloutPools"
"""The root deployment's name in a rollout's second app."""
IDLE_POOL_AUTOSCALING: dict[str, Any] = {
    "min_replicas": 0,
    "max_replicas": 1,
    "initial_replicas": 0,
}
"""How a pool is held at 0 replicas: Serve refuses a fixed ``num_replicas`` of 0, but an
autoscaling range from 0 stays at 0 while no request reaches the pool (pairing by fingerprint
sends none to a version without live replicas)."""


class RolloutPools:
    """Holds one app's pool handles: ``{served name: (prefill or None, decode)}``."""

    def __init__(self, pools: dict[str, tuple[DeploymentHandle | None, DeploymentHandle]]) -> None:
        self._pools = pools

    def models(self) -> list[str]:
        """The served models whose pools this app holds."""
        return sorted(self._pools)
