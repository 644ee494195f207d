"""The Ray Serve application builder: a ``ClusterConfig`` becomes its bound deployments.

Per served model a ``Prefill`` and a ``Decode`` deployment (each with its own replica count or
autoscaling range, resources and node selector; with several models named ``Decode-<model>``),
the ``StatsBoard`` they report to, and the HTTP ``Ingress`` that holds handles to all of them
(``{served name: (prefill, decode)}``). Options come from the config through ``.options(...)``;
nothing is baked into decorators.

Routing: each pool gets a request router for ``routing.policy``
(``cluster.routing.pool_router_config``) and its replicas publish their engine's KV events to the
app's KV index actor (``IndexPublisherFactory``), which the prefix-aware routers follow.

``prefill.num_replicas: 0`` leaves the Prefill deployment out (Serve has no fixed count of 0):
every request then prefills on decode — colocated serving on the same stack.

Two entry points: :func:`build_app_from_config` (typed, for Python callers and tests) and
:func:`build_app` (Serve's application-builder signature), so a Serve config file works too::

    applications:
      - name: pdserve
        import_path: cluster.app:build_app
        args: {config: configs/local.yaml}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application, Deployment

from cluster.routing.kv_index.actor import IndexPublisherFactory
from cluster.routing.pool_router_config import request_router_config
from cluster.serve.config_file import config_to_mapping, load_cluster_config
from cluster.serve.gang import gang_engine_factory, gang_options
from cluster.serve.ingress_deployment import IngressDeployment
from cluster.serve.pool_options import (
    BOARD_DEPLOYMENT,
    INGRESS_DEPLOYMENT,
    board_deployment_options,
    ingress_deployment_options,
    pool_deployment_name,
    pool_deployment_options,
)
from cluster.serve.replica_identity import ServeReplicaIdentity
from cluster.serve.stats_board import BoardReporter, StatsBoard
from core.codec import to_plain
from core.config import ClusterConfig, Role, ServedModel
from core.errors import ConfigError
from decode.deployment import DecodeDeployment
from prefill.deployment import PrefillDeployment
from replica import KVToken, ReplicaHooks, ReplicaSpec


def build_app_from_config(config: ClusterConfig) -> Application:
    """The pdserve Serve application for ``config`` (deploy with ``serve.run``)."""
    kv_token = KVToken.for_deploy(config.transfer)
    board = _deployment(StatsBoard, BOARD_DEPLOYMENT, board_deployment_options()).bind()
    pools = {
        served.name: _model_pools(config, served, kv_token) for served in config.served_models()
    }
    ingress = _deployment(
        IngressDeployment,
        INGRESS_DEPLOYMENT,
        ingress_deployment_options(config.server, reports_latency=config.planner.mode == "slo"),
    )
    return ingress.bind(pools, board, config_to_mapping(config))


def _model_pools(
    config: ClusterConfig, served: ServedModel, kv_token: KVToken | None
) -> tuple[Application | None, Application]:
    """One model's Prefill (None without a prefill pool) and Decode deployments, bound."""
    prefill = None
    if served.prefill.deployed:
        prefill = _role_deployment(PrefillDeployment, config, served, "prefill", kv_token)
    return prefill, _role_deployment(DecodeDeployment, config, served, "decode", kv_token)


def _role_deployment(
    cls: type, config: ClusterConfig, served: ServedModel, role: Role, kv_token: KVToken | None
) -> Application:
    """One pool's deployment bound to its replica spec (plain data) and hooks."""
    deployment = _deployment(
        cls, pool_deployment_name(role, served.scope), _pool_options(config, served, role)
    )
    hooks = ReplicaHooks(
        identity=ServeReplicaIdentity(),
        stats_reporter=BoardReporter(config.cluster.app_name, model=served.scope),
        kv_events=IndexPublisherFactory(
            served.pool_key(role),
            num_shards=config.routing.kv_index_shards,
            stride=config.routing.kv_index_stride,
        ),
        gang=gang_engine_factory(served.pool_for(role)),
    )
    return deployment.bind(to_plain(replica_spec(config, served, role, kv_token)), hooks)


def replica_spec(
    config: ClusterConfig, served: ServedModel, role: Role, kv_token: KVToken | None
) -> ReplicaSpec:
    """What each replica of ``served``'s ``role`` pool boots from."""
    return ReplicaSpec(
        role=role,
        model=served.model,
        engine=served.engine_for(role),
        transfer=config.transfer,
        kv_failure_policy=served.decode.kv_failure_policy,
        kv_token=kv_token,
    )


def _pool_options(config: ClusterConfig, served: ServedModel, role: Role) -> dict[str, Any]:
    """A pool's deployment options plus its request router for the configured policy."""
    pool = served.pool_for(role)
    return {
        **pool_deployment_options(pool),
        **gang_options(pool),
        "request_router_config": request_router_config(
            role,
            config.routing.policy,
            block_size=served.engine_for(role).block_size,
            options={
                "model": served.scope,
                "index_shards": config.routing.kv_index_shards,
                "index_stride": config.routing.kv_index_stride,
                "hot_prefixes": config.routing.hot_prefixes.model_dump(),
                "deliver_copies": True,  # hot_prefix: the router calls holder and target
            },
        ),
    }


def _deployment(cls: type, name: str, options: Mapping[str, Any]) -> Deployment:
    """``cls`` as a Serve deployment named ``name`` with ``options`` applied."""
    return serve.deployment(name=name)(cls).options(**options)


def build_app(args: Mapping[str, Any]) -> Application:
    """Serve's builder entry point: ``args["config"]`` is a YAML path or a config mapping."""
    if "config" not in args:
        raise ConfigError("application args need 'config': a YAML path or mapping", param="config")
    unknown = sorted(set(args) - {"config"})
    if unknown:
        raise ConfigError(f"unknown application args: {', '.join(unknown)}", param=unknown[0])
    return build_app_from_config(load_cluster_config(args["config"]))
