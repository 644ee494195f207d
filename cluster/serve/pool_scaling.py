"""How a pool's size reaches Serve without changing the app's code version.

Serve 2.60 hashes into an app's code version, besides its import path and ``args``, the app's
autoscaling policy, its request routers and the ``policy`` of every deployment override whose
``autoscaling_config`` is a mapping (``get_app_code_version``): a PUT that gives a pool an
``autoscaling_config`` it did not have, takes one away or names a policy in it restarts every
replica of the app — the ingress and the stats board too. So every pool's size travels, from
the first deploy on, as an ``autoscaling_config`` override naming no policy, and only its
bounds ever change: a fixed size N is the range N..N; an idle pool (a stepped rollout's version
at 0; Serve refuses ``num_replicas: 0``) is the range from 0 that Serve's default policy takes
to 0 as soon as no request is on it (a request that still reaches it starts a replica: Serve's
cold start); an autoscaled pool keeps its configured range. Apps the planner sizes (an
app-level policy) keep fixed counts as ``num_replicas``: the planner's policy would size a
range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster.serve.pool_options import autoscaling_options, pool_deployment_name
from core.config import ClusterConfig, PoolConfig

IDLE_LOOK_BACK_S = 1.0
"""How far back Serve's default policy averages an idle pool's requests: the last replica of a
version going to 0 stops about this long after its last request ended."""


def fixed_range(num_replicas: int) -> dict[str, Any]:
    """The ``autoscaling_config`` of a pool held at ``num_replicas`` (>= 1)."""
    return {"min_replicas": num_replicas, "max_replicas": num_replicas}


def idle_range(max_replicas: int = 1) -> dict[str, Any]:
    """The ``autoscaling_config`` of a pool held at 0 (``max_replicas``: a multiple of its
    gang size, what a request that still reaches it may start)."""
    return {
        "min_replicas": 0,
        "max_replicas": max_replicas,
        "initial_replicas": 0,
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "downscale_to_zero_delay_s": 0.0,
        "look_back_period_s": IDLE_LOOK_BACK_S,
    }


def pool_range(pool: PoolConfig) -> dict[str, Any]:
    """A pool's ``autoscaling_config`` as configured: its range, or its fixed size's."""
    return autoscaling_options(pool) or fixed_range(pool.initial_replicas)


def pool_overrides(config: ClusterConfig, *, idle: bool = False) -> list[dict[str, Any]]:
    """The ``deployments`` overrides sizing every pool of ``config`` (``idle``: each at 0, a
    stepped rollout's new app before its first step)."""
    overrides = []
    for served in config.served_models():
        for role in ("prefill", "decode"):
            pool = served.pool_for(role)
            if role == "prefill" and not served.prefill.deployed:
                continue
            scaling = idle_range(pool.expert_parallel) if idle else pool_range(pool)
            overrides.append(
                {"name": pool_deployment_name(role, served.scope), "autoscaling_config": scaling}
            )
    return overrides


def resized(entry: Mapping[str, Any], num_replicas: int) -> dict[str, Any]:
    """A pool's override ``entry`` resized to ``num_replicas`` (0: idle, its range's top kept
    as what a late request may start, so a gang's multiple holds)."""
    scaling = dict(entry.get("autoscaling_config") or {})
    updated = {k: v for k, v in entry.items() if k != "num_replicas"}
    if num_replicas == 0:
        updated["autoscaling_config"] = idle_range(max(int(scaling.get("max_replicas", 1)), 1))
    else:
        updated["autoscaling_config"] = fixed_range(num_replicas)
    return updated
