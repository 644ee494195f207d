"""Which config fields a running app takes without restarting a replica, and how they travel.

Serve restarts every replica when an app's ``args`` change (they are part of its code version),
but a deployment's ``user_config`` is a lightweight update: Serve calls the replica's
``reconfigure`` with it. The ingress alone reads :data:`IN_PLACE_FIELDS` (the disaggregation
decision, the migration limit, the virtual model names), so ``pdserve upgrade`` sends their new
values as the Ingress deployment's ``user_config`` (:func:`in_place_user_config`) and the
ingress rebuilds its app from its ``args`` config overlaid with them (:func:`with_in_place`).
Routing fields the pools' request routers or replicas read (``policy``, ``hot_prefixes``, the
KV index shards and stride) and the planner travel in Serve's code version, so they are not
here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster.serve.config_file import config_to_mapping, load_cluster_config
from core.config import ClusterConfig
from core.errors import ConfigError

IN_PLACE_FIELDS = ("disaggregation", "virtual_models", "routing.migration_limit")
"""Dotted config paths the ingress applies in place."""


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
    return load_cluster_config(mapping)


def _dotted(mapping: Mapping[str, Any], path: str) -> Any:
    value: Any = mapping
    for part in path.split("."):
        value = value[part]
    return value
