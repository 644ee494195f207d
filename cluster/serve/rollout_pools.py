"""The root of a rolling upgrade's second app (the new version's pools, and nothing else), and
how the ingress is told to follow it.

Serve deploys what an app's root binds, so this tiny deployment (one replica, no CPU) holds the
handles of the new version's Prefill and Decode deployments; it serves no request. The pools'
replicas report to the running app's stats board and KV index (the app builder's
:func:`~cluster.serve.app_builder.build_pools_app_from_config`). The running app's ingress
learns of the second app through its ``user_config`` (:data:`FOLLOW_KEY`, beside the in-place
config fields), so following it restarts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

ROLLOUT_ROOT_DEPLOYMENT = "RolloutPools"
"""The root deployment's name in a rollout's second app."""
HOLD_AT_ZERO_POLICY = "cluster.serve.rollout_pools:hold_at_zero"
IDLE_POOL_AUTOSCALING: dict[str, Any] = {
    "min_replicas": 0,
    "max_replicas": 1,
    "initial_replicas": 0,
    "downscale_delay_s": 0.0,
    "downscale_to_zero_delay_s": 0.0,
    "policy": {"policy_function": HOLD_AT_ZERO_POLICY},
}
"""How a pool is held at 0 replicas: Serve refuses a fixed ``num_replicas`` of 0, so the pool
gets an autoscaling range from 0 whose policy (:func:`hold_at_zero`) always asks for none; its
replicas stop at once, gracefully, as a scale-down stops them. (Serve still starts one if a
request reaches a pool at 0, its cold-start path.)"""


def hold_at_zero(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Serve's custom autoscaling policy of an idle pool: no replicas, whatever the load."""
    return 0, {}


class RolloutPools:
    """Holds one app's pool handles: ``{served name: (prefill or None, decode)}``."""

    def __init__(self, pools: dict[str, tuple[DeploymentHandle | None, DeploymentHandle]]) -> None:
        self._pools = pools

    def models(self) -> list[str]:
        """The served models whose pools this app holds."""
        return sorted(self._pools)


FOLLOW_KEY = "pools_apps"
"""The Ingress deployment's ``user_config`` key naming, per served model, the Serve app its
new version's pools run in while a stepped rollout serves two (``{served name: app}``)."""


def split_user_config(
    user_config: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The ingress's ``user_config`` as its in-place config fields and the pools apps it
    follows (:data:`FOLLOW_KEY`)."""
    fields = dict(user_config or {})
    apps = fields.pop(FOLLOW_KEY, None) or {}
    if not isinstance(apps, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in apps.items()
    ):
        raise ConfigError(
            f"user_config.{FOLLOW_KEY} maps served model names to app names, got {apps!r}",
            param=f"user_config.{FOLLOW_KEY}",
        )
    return fields, dict(apps)
