"""Ray Serve deployment names and options from the YAML's pool and server sections.

Pure functions (no Ray import) so the mapping is unit-testable and reused by the app builder
and by ``pdserve scale``: replica count or ``autoscaling_config``, per-replica resources, the
node selector (Ray node labels -> ``label_selector``; a custom resource -> a small claim on
it), Serve's backpressure limits, and the worker processes' environment (glibc malloc
thresholds the KV data plane needs from process start: ``transfer.process_env``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from core.config import PoolConfig, ServerConfig
from transfer.process_env import MALLOC_ENV

PREFILL_DEPLOYMENT = "Prefill"
DECODE_DEPLOYMENT = "Decode"
INGRESS_DEPLOYMENT = "Ingress"
BOARD_DEPLOYMENT = "StatsBoard"
"""Deployment names inside the pdserve application (the pools' names of a one-model cluster)."""

_ROLE_DEPLOYMENTS = {"prefill": PREFILL_DEPLOYMENT, "decode": DECODE_DEPLOYMENT}


def pool_deployment_name(role: str, scope: str = "") -> str:
    """The Serve deployment of a model's ``role`` pool: ``Prefill`` / ``Decode`` for the one
    model of a single-model cluster, ``Decode-tiny-moe`` for one of several (characters Serve
    or a URL would mind become ``_``)."""
    base = _ROLE_DEPLOYMENTS[role]
    if not scope:
        return base
    return f"{base}-{re.sub(r'[^A-Za-z0-9._-]', '_', scope)}"


def pool_of_deployment(name: str) -> tuple[str, str] | None:
    """``(role, suffix)`` of a pool deployment name (suffix empty for the one-model names);
    None for the other deployments."""
    for role, base in _ROLE_DEPLOYMENTS.items():
        if name == base:
            return role, ""
        if name.startswith(base + "-"):
            return role, name[len(base) + 1 :]
    return None


INGRESS_HEADROOM = 2
"""Serve lets this many times the ingress's own in-flight limit through, so the app (not
Serve's proxy queue) answers the excess with an OpenAI-shaped 429."""


def ray_actor_options(pool: PoolConfig) -> dict[str, Any]:
    """``ray_actor_options`` of one replica: CPUs, GPUs, memory, resources, labels."""
    options: dict[str, Any] = {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus}
    resources = dict(pool.resources)
    selector = pool.node_selector
    if selector.resource:
        resources[selector.resource] = selector.resource_per_replica
    if resources:
        options["resources"] = resources
    if selector.labels:
        options["label_selector"] = dict(selector.labels)
    if pool.memory_bytes is not None:
        options["memory"] = pool.memory_bytes
    options["runtime_env"] = worker_runtime_env()
    return options


def worker_runtime_env(base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``base`` (a Ray ``runtime_env``) plus :data:`MALLOC_ENV` in its ``env_vars``; variables
    ``base`` already sets win."""
    runtime_env = dict(base or {})
    runtime_env["env_vars"] = {**MALLOC_ENV, **dict(runtime_env.get("env_vars") or {})}
    return runtime_env


def autoscaling_options(pool: PoolConfig) -> dict[str, Any] | None:
    """Serve's ``autoscaling_config`` for the pool's range; None for a fixed count."""
    scaling = pool.autoscaling
    if scaling is None:
        return None
    options: dict[str, Any] = {
        "min_replicas": scaling.min_replicas,
        "max_replicas": scaling.max_replicas,
        "target_ongoing_requests": scaling.target_ongoing_requests,
        "upscale_delay_s": scaling.upscale_delay_s,
        "downscale_delay_s": scaling.downscale_delay_s,
    }
    if scaling.initial_replicas is not None:
        options["initial_replicas"] = scaling.initial_replicas
    if scaling.look_back_period_s is not None:
        options["look_back_period_s"] = scaling.look_back_period_s
    if scaling.metrics_interval_s is not None:
        options["metrics_interval_s"] = scaling.metrics_interval_s
    return options


def pool_deployment_options(pool: PoolConfig) -> dict[str, Any]:
    """Keyword arguments of ``Deployment.options(...)`` for a prefill or decode pool."""
    options: dict[str, Any] = {
        "ray_actor_options": ray_actor_options(pool),
        "max_ongoing_requests": pool.max_ongoing_requests,
        "max_queued_requests": pool.max_queued_requests,
        "graceful_shutdown_timeout_s": pool.graceful_shutdown_timeout_s,
    }
    autoscaling = autoscaling_options(pool)
    if autoscaling is None:
        options["num_replicas"] = pool.initial_replicas
    else:
        options["autoscaling_config"] = autoscaling
    return options


def ingress_deployment_options(server: ServerConfig, reports_latency: bool) -> dict[str, Any]:
    """``Deployment.options(...)`` of the HTTP ingress. With ``reports_latency`` (the ``slo``
    planner) its fixed count is an autoscaling range of one size, because Serve collects
    custom metrics (the p90 latencies the planner reads) only from autoscaled deployments."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": server.num_cpus},
        "max_ongoing_requests": server.max_in_flight_requests * INGRESS_HEADROOM,
    }
    if reports_latency:
        size = server.num_replicas
        options["autoscaling_config"] = {"min_replicas": size, "max_replicas": size}
    else:
        options["num_replicas"] = server.num_replicas
    return options


def board_deployment_options() -> dict[str, Any]:
    """``Deployment.options(...)`` of the stats board: one tiny replica, no CPU reserved."""
    return {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": 1000}
