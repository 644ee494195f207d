"""What the app builder calls: a pool's ``RequestRouterConfig`` from the YAML policy name.

``request_router_config("prefill", cfg.routing.policy, block_size=engine.block_size)`` (all
from the one ``ClusterConfig``) goes into ``serve.deployment(request_router_config=...)`` of the
Prefill deployment (the same with ``"decode"`` for Decode). The built-in names map to the named
router classes; a policy added with ``register_policy`` uses the generic router.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.serve.config import RequestRouterConfig

from cluster.routing.router_kwargs import RouterSettings
from cluster.routing.serve_router import (
    HotPrefixRequestRouter,
    LeastLoadedRequestRouter,
    PdserveRequestRouter,
    PrefixAwareRequestRouter,
    RoundRobinRequestRouter,
)

ROUTER_CLASSES: dict[str, type[PdserveRequestRouter]] = {
    "prefix_aware": PrefixAwareRequestRouter,
    "least_loaded": LeastLoadedRequestRouter,
    "round_robin": RoundRobinRequestRouter,
    "hot_prefix": HotPrefixRequestRouter,
}

DEFAULT_ROUTING_STATS_PERIOD_S = 1.0


def request_router_config(
    pool: str,
    policy: str = "prefix_aware",
    *,
    block_size: int,
    options: Mapping[str, Any] | None = None,
    routing_stats_period_s: float = DEFAULT_ROUTING_STATS_PERIOD_S,
) -> RequestRouterConfig:
    """The Serve router config of one pool.

    ``options`` are further ``RouterSettings`` keys (``weights``, ``hot_spot``,
    ``session_ttl_s``, ``poll_interval_s``, ...). Raises ``ConfigError`` for an unknown pool,
    policy or option. ``routing_stats_period_s`` is how often Serve calls the deployments'
    ``record_routing_stats`` (the KV blocks and waiting requests the policy reads).
    """
    kwargs: dict[str, Any] = {
        **dict(options or {}),
        "pool": pool,
        "policy": policy,
        "block_size": block_size,
    }
    settings = RouterSettings.from_kwargs(kwargs)
    config: dict[str, Any] = {
        "request_router_class": ROUTER_CLASSES.get(policy, PdserveRequestRouter),
        "request_router_kwargs": settings.to_kwargs(),
        "request_routing_stats_period_s": routing_stats_period_s,
        "request_routing_stats_timeout_s": max(routing_stats_period_s * 3, 5.0),
    }
    return RequestRouterConfig(**config)
