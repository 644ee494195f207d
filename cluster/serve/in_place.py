"""Which config fields a running app takes without restarting a replica, and how they travel.

Serve restarts every replica when an app's code version changes, and that version covers the
app's ``args``, its autoscaling policy with its ``policy_kwargs`` and any
``request_router_config`` a deploy overrides (Ray 2.60; a Serve request router is also built
once, in the caller's process, from its kwargs). A deployment's ``user_config`` is the
lightweight update: Serve calls the running replicas' ``reconfigure`` with it. So ``pdserve
upgrade`` sends the new values of :data:`IN_PLACE_FIELDS` as the Ingress deployment's
``user_config`` (:func:`in_place_user_config`); the ingress overlays them on its ``args``
config (:func:`with_in_place`), rebuilds its app for the fields it reads (the disaggregation
decision, the migration limit, the virtual models) and hands the rest on inside the running
cluster: the routing knobs to the pools' routers in its own process
(``cluster.routing.live_settings``), the planner's settings to the app's autoscaling policy
(``cluster.serve.planner_settings``).

What replicas read, or what changes the app's shape, still needs a redeploy: the KV index's
shards and stride (every replica publishes by them), and the planner's mode and capacity
profile (:data:`PINNED_FIELDS`: they decide whether the app has a policy, which one, and the
ingress's own deployment options).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster.serve.config_file import config_to_mapping, load_cluster_config
from core.config import ClusterConfig
from core.errors import ConfigError

IN_PLACE_FIELDS = (
    "disaggregation",
    "virtual_models",
    "routing.migration_limit",
    "routing.policy",
    "routing.hot_prefixes",
    "planner",
)
"""Dotted config paths applied in place (a section: every field of it but :data:`PINNED_FIELDS`)."""
PINNED_FIELDS = ("planner.mode", "planner.profile")
"""Fields under :data:`IN_PLACE_FIELDS` that only a redeploy changes."""


def applies_in_place(path: str) -> bool:
    """A change of the dotted field ``path`` applies without restarting a replica."""
    if path in PINNED_FIELDS:
        return False
    return any(path == f or path.startswith(f + ".") for f in IN_PLACE_FIELDS)


def field_value(config: ClusterConfig, path: str) -> Any:
    """The value at a dotted ``path`` of ``config``."""
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def in_place_user_config(config: ClusterConfig) -> dict[str, Any]:
    """The Ingress deployment's ``user_config`` carrying ``config``'s in-place fields (JSON)."""
    dumped = config.model_dump(mode="json")
    return {path: _dotted(dumped, path) for path in IN_PLACE_FIELDS}


def with_in_place(base: ClusterConfig, user_config: Mapping[str, Any] | None) -> ClusterConfig:
    """``base`` with the in-place fields of ``user_config`` (None or empty: ``base``)."""
    if not user_config:
        return base
    unknown = sorted(set(user_config) - set(IN_PLACE_FIELDS))
    if unknown:
        raise ConfigError(
            f"the ingress's user_config may set only {', '.join(IN_PLACE_FIELDS)}; got "
            f"{', '.join(unknown)}",
            param=f"user_config.{unknown[0]}",
        )
    mapping = config_to_mapping(base)
    for path, value in user_config.items():
        *parents, leaf = path.split(".")
        target = mapping
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    config = load_cluster_config(mapping)
    for path in PINNED_FIELDS:
        if field_value(config, path) != field_value(base, path):
            raise ConfigError(
                f"the ingress's user_config may not change {path} (deployed "
                f"{field_value(base, path)!r}, got {field_value(config, path)!r}): that takes "
                "a redeploy",
                param=f"user_config.{path}",
            )
    return config


def _dotted(mapping: Mapping[str, Any], path: str) -> Any:
    value: Any = mapping
    for part in path.split("."):
        value = value[part]
    return value
