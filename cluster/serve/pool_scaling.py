"""How a fixed pool's size reaches Serve without changing the app's code version.

Serve 2.60 hashes into an app's code version, besides its import path and ``args``, the app's
autoscaling policy, its request routers and the ``policy`` of every deployment override whose
``autoscaling_config`` is a mapping (``get_app_code_version``): a PUT that gives a pool an
``autoscaling_config`` it did not have, takes one away or names another policy restarts every
replica of the app — the ingress and the stats board too. Serve also refuses a fixed
``num_replicas`` of 0, which a stepped rollout needs (a version's pools at 0). So every fixed
pool's size travels, from the first deploy on, as an ``autoscaling_config`` override naming one
policy, :func:`hold_at_lower_bound`, and only its bounds ever change: a size N is the range
N..N, a pool at 0 the range 0..M. The policy holds the pool at the lower bound whatever its
load, so a pool set to 0 stops its replicas at once (each drains within the pool's graceful
shutdown; a request that still reaches a pool at 0 starts one, Serve's cold start). Autoscaled
pools keep their configured range in the app's code (no override), and apps the planner sizes
(an app-level policy) have none either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster.serve.pool_options import pool_deployment_name
from core.config import ClusterConfig

HOLD_POLICY: dict[str, Any] = {"policy_function": "cluster.serve.pool_scaling:hold_at_lower_bound"}
"""The one policy every fixed pool's override names (another would change the code version)."""


def hold_at_lower_bound(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Serve's autoscaling policy of a fixed pool: its range's lower bound, whatever the load
    (N of N..N; 0 of a pool set to 0)."""
    return int(ctx.config.min_replicas), {}


def fixed_range(num_replicas: int) -> dict[str, Any]:
    """The ``autoscaling_config`` of a pool held at ``num_replicas`` (>= 1)."""
    return {
        "min_replicas": num_replicas,
        "max_replicas": num_replicas,
        **_AT_ONCE,
        "policy": dict(HOLD_POLICY),
    }


def idle_range(max_replicas: int = 1) -> dict[str, Any]:
    """The ``autoscaling_config`` of a pool held at 0 (``max_replicas``: a multiple of its
    gang size, what a request that still reaches it may start)."""
    return {
        "min_replicas": 0,
        "max_replicas": max_replicas,
        "initial_replicas": 0,
        **_AT_ONCE,
        "downscale_to_zero_delay_s": 0.0,
        "policy": dict(HOLD_POLICY),
    }


METRICS_INTERVAL_S = 1.0
"""How often a fixed pool's handles push their request counts to Serve's controller."""
METRICS_WINDOW_S = 2.0
"""The window Serve averages those counts over."""
QUIET_S = METRICS_WINDOW_S + METRICS_INTERVAL_S
"""How long after a pool's last request Serve counts none there. Serve starts a replica for a
pool at 0 that it counts requests for (its cold start, which no policy overrides), so a pool
is taken to 0 only once it has been this long without one (``cluster.ops.rollout``)."""

_AT_ONCE = {
    "upscale_delay_s": 0.0,
    "downscale_delay_s": 0.0,
    "metrics_interval_s": METRICS_INTERVAL_S,
    "look_back_period_s": METRICS_WINDOW_S,
}
"""A new size applies at the next control loop (Serve's downscale delay would wait minutes),
and requests a pool no longer has leave Serve's count within :data:`QUIET_S` (its default
window, 30 s, kept cold-starting a pool set to 0 for half a minute after its last request)."""


def pool_overrides(config: ClusterConfig, *, idle: bool = False) -> list[dict[str, Any]]:
    """The ``deployments`` overrides sizing every fixed pool of ``config`` (``idle``: each at
    0, a stepped rollout's new app before its first step)."""
    overrides = []
    for served in config.served_models():
        for role in ("prefill", "decode"):
            pool = served.pool_for(role)
            if (role == "prefill" and not served.prefill.deployed) or pool.autoscaling:
                continue
            scaling = (
                idle_range(pool.expert_parallel) if idle else fixed_range(pool.initial_replicas)
            )
            overrides.append(
                {"name": pool_deployment_name(role, served.scope), "autoscaling_config": scaling}
            )
    return overrides


def holds(entry: Mapping[str, Any]) -> bool:
    """Whether a deployment override ``entry`` sizes its pool by :data:`HOLD_POLICY`."""
    scaling = entry.get("autoscaling_config")
    return isinstance(scaling, Mapping) and scaling.get("policy") == HOLD_POLICY


def resized(entry: Mapping[str, Any], num_replicas: int) -> dict[str, Any]:
    """A held pool's override ``entry`` (:func:`holds`) resized to ``num_replicas`` (0: its
    range's top kept as what a late request may start, so a gang's multiple holds)."""
    scaling = dict(entry.get("autoscaling_config") or {})
    updated = {k: v for k, v in entry.items() if k != "num_replicas"}
    if num_replicas == 0:
        updated["autoscaling_config"] = idle_range(max(int(scaling.get("max_replicas", 1)), 1))
    else:
        updated["autoscaling_config"] = fixed_range(num_replicas)
    return updated
