"""Serve's declarative deploy config (the ``serve deploy`` schema) for a ``ClusterConfig``.

pdserve deploys through Serve's REST API rather than ``serve.run`` so that the code version of
the app is stable (it hashes ``import_path`` and ``args``): a later PUT that only changes a
deployment's ``num_replicas`` is applied in place — replicas are added or removed, none is
restarted. That is how ``pdserve scale`` resizes a pool live. Pure dict manipulation, no Ray.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from cluster.planner.capacity_model import CapacityModel
from cluster.serve.config_file import config_to_mapping
from cluster.serve.planner_policy import POLICY_FUNCTION
from cluster.serve.planner_settings import PlannerSettings
from cluster.serve.pool_scaling import holds, pool_overrides, resized
from core.codec import to_plain
from core.config import ClusterConfig
from core.errors import ConfigError

IMPORT_PATH = "cluster.app:build_app"
"""The application builder Serve imports on the cluster."""
POOLS_IMPORT_PATH = "cluster.app:build_pools_app"
"""The builder of a stepped rollout's second app (the new version's pools only)."""


def app_schema(config: ClusterConfig) -> dict[str, Any]:
    """One application entry: the builder plus the whole config as its ``args``, and pdserve's
    planner as the app's autoscaling policy when ``planner.mode`` is not ``off``."""
    entry: dict[str, Any] = {
        "name": config.cluster.app_name,
        "route_prefix": config.cluster.route_prefix,
        "import_path": IMPORT_PATH,
        "args": {"config": config_to_mapping(config)},
    }
    planner = config.planner
    if planner.mode != "off":
        entry["autoscaling_policy"] = {
            "policy_function": POLICY_FUNCTION,
            "policy_kwargs": planner_kwargs(config),
        }
    else:
        entry["deployments"] = pool_overrides(config)
    return entry


def pools_app_schema(config: ClusterConfig, app_name: str) -> dict[str, Any]:
    """The application entry of a stepped rollout's second app ``app_name``: the new
    ``config``'s pools, no HTTP route (the running app's ingress reaches them by handle)."""
    if app_name == config.cluster.app_name:
        raise ConfigError(
            f"a rollout's pools need an app of their own, not the running {app_name!r}",
            param="app",
        )
    return {
        "name": app_name,
        "route_prefix": None,
        "import_path": POOLS_IMPORT_PATH,
        "args": {"config": config_to_mapping(config)},
        "deployments": pool_overrides(config, idle=True),
    }


def with_app(current: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` (a PUT body) with the application ``entry`` added, or replacing the one of
    its name; every other app is sent back unchanged."""
    schema = copy.deepcopy(dict(current))
    apps = [a for a in schema.get("applications", []) if a.get("name") != entry["name"]]
    schema["applications"] = [*apps, dict(entry)]
    return schema


def planner_kwargs(config: ClusterConfig) -> dict[str, Any]:
    """The planner policy's ``policy_kwargs``: its settings as deployed (an in-place upgrade
    changes them through ``cluster.serve.planner_settings``, not here: these kwargs are in the
    app's code version) and, for ``slo``, the capacity model read here (the controller that
    runs the policy may not see this machine's files)."""
    planner = config.planner
    kwargs: dict[str, Any] = PlannerSettings.of(config).to_json()
    if planner.mode == "slo" and planner.profile:
        kwargs["capacity"] = to_plain(CapacityModel.load(planner.profile))
    return kwargs


def deploy_schema(
    config: ClusterConfig, others: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The full PUT body: HTTP options plus pdserve's app and any ``others`` left as they are.

    A PUT replaces every declaratively deployed app, so the apps already on the cluster that
    are not ours (``others``: name -> deployed app config) are sent back unchanged.
    """
    server = config.server
    http: dict[str, Any] = {"host": server.host, "port": server.port}
    if server.request_timeout_s is not None:
        http["request_timeout_s"] = server.request_timeout_s
    apps = [dict(app) for name, app in (others or {}).items() if name != config.cluster.app_name]
    return {
        "proxy_location": server.proxy_location,
        "http_options": http,
        "applications": [*apps, app_schema(config)],
    }


def configured_schema(
    current: Mapping[str, Any], app_name: str, deployment: str, user_config: Mapping[str, Any]
) -> dict[str, Any]:
    """``current`` (a PUT body) with ``deployment`` of ``app_name`` given ``user_config``: the
    app's code version is unchanged, so Serve calls ``reconfigure`` on its running replicas
    instead of replacing them."""
    schema = copy.deepcopy(dict(current))
    app = next((a for a in schema.get("applications", []) if a.get("name") == app_name), None)
    if app is None:
        raise ConfigError(f"no application {app_name!r} is deployed", param="app")
    overrides: list[dict[str, Any]] = list(app.get("deployments") or [])
    entry = next((d for d in overrides if d.get("name") == deployment), None)
    if entry is None:
        entry = {"name": deployment}
        overrides.append(entry)
    entry["user_config"] = dict(user_config)
    app["deployments"] = overrides
    return schema


def scaled_schema(
    current: Mapping[str, Any], app_name: str, replicas: Mapping[str, int]
) -> dict[str, Any]:
    """``current`` (a PUT body) with deployments of ``app_name`` set to fixed replica counts.

    ``replicas`` maps a deployment name (``Prefill``, ``Decode``) to its new count. A fixed
    pool's override keeps its policy and only its bounds change, so the app's code version does
    not (:mod:`cluster.serve.pool_scaling`): a count is the range N..N, 0 the range from 0. An
    autoscaled pool (or one the planner sizes) gets a fixed ``num_replicas`` instead; 0 is
    refused for it (its range's ``min_replicas`` says that).
    """
    schema = copy.deepcopy(dict(current))
    apps = schema.get("applications", [])
    app = next((a for a in apps if a.get("name") == app_name), None)
    if app is None:
        raise ConfigError(f"no application {app_name!r} is deployed", param="app")
    overrides: list[dict[str, Any]] = list(app.get("deployments") or [])
    for name, count in replicas.items():
        index = next((i for i, d in enumerate(overrides) if d.get("name") == name), None)
        entry = {"name": name} if index is None else overrides[index]
        held = holds(entry)
        if count < 0 or (count == 0 and not held):
            why = "" if held or count < 0 else " (an autoscaled pool: set min_replicas: 0)"
            raise ConfigError(
                f"replicas of {name} must be >= {0 if held else 1}, got {count}{why}", param=name
            )
        if held:
            entry = resized(entry, count)
        else:
            entry = {**entry, "num_replicas": count, "autoscaling_config": None}
        if index is None:
            overrides.append(entry)
        else:
            overrides[index] = entry
    app["deployments"] = overrides
    return schema
