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

A rolling upgrade's second app (:func:`build_pools_app_from_config`, Serve's
:func:`build_pools_app`) holds only the new version's pools, each deployed with 0 replicas for
the rollout to grow (fixed pool sizes only); their replicas report to the running app's stats
board and publish to its KV index, and their routers follow that index. They carry no KV
transfer secret of their own: the running app's board holds its generated one and they fetch
it at boot (``cluster.serve.board_kv_token``), so KV moves between the two versions' replicas
of one fingerprint, and the secret is in neither app's args.

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
from cluster.serve.board_kv_token import BoardKVToken
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
from cluster.serve.pool_scaling import idle_range
from cluster.serve.replica_identity import ServeReplicaIdentity
from cluster.serve.rollout_pools import (
    ROLLOUT_ROOT_DEPLOYMENT,
    RolloutPools,
)
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
    board_deployment = _deployment(StatsBoard, BOARD_DEPLOYMENT, board_deployment_options())
    board = board_deployment.bind(kv_token=kv_token)  # a rollout's second app asks it
    pools = {
        served.name: _model_pools(config, served, kv_token) for served in config.served_models()
    }
    ingress = _deployment(
        IngressDeployment,
        INGRESS_DEPLOYMENT,
        ingress_deployment_options(config.server, reports_latency=config.planner.mode == "slo"),
    )
    return ingress.bind(pools, board, config_to_mapping(config))


def build_pools_app_from_config(config: ClusterConfig) -> Application:
    """The new version's pools for a stepped rollout of the running app
    (``config.cluster.app_name``), deployed as another app: every pool at 0 replicas, reporting
    to the running app's stats board and KV index, and sharing its KV secret."""
    for served in config.served_models():
        for role in ("prefill", "decode"):
            if served.pool_for(role).autoscaling is not None:
                raise ConfigError(
                    f"model {served.name}: a stepped rollout needs fixed pool sizes; "
                    f"{role} is autoscaled",
                    param=f"{served.field_path}{role}.autoscaling",
                )
    pools = {
        served.name: _model_pools(config, served, None, rollout=True)
        for served in config.served_models()
    }
    root = _deployment(RolloutPools, ROLLOUT_ROOT_DEPLOYMENT, board_deployment_options())
    return root.bind(pools)


def _model_pools(
    config: ClusterConfig, served: ServedModel, kv_token: KVToken | None, *, rollout: bool = False
) -> tuple[Application | None, Application]:
    """One model's Prefill (None without a prefill pool) and Decode deployments, bound."""
    prefill = None
    if served.prefill.deployed:
        prefill = _role_deployment(PrefillDeployment, config, served, "prefill", kv_token, rollout)
    return prefill, _role_deployment(DecodeDeployment, config, served, "decode", kv_token, rollout)


def _role_deployment(
    cls: type,
    config: ClusterConfig,
    served: ServedModel,
    role: Role,
    kv_token: KVToken | None,
    rollout: bool,
) -> Application:
    """One pool's deployment bound to its replica spec (plain data) and hooks; its replicas
    report to the running app's board and index (``rollout``: from another app, starting
    empty)."""
    home_app = config.cluster.app_name
    options = _pool_options(config, served, role, rollout)
    deployment = _deployment(cls, pool_deployment_name(role, served.scope), options)
    hooks = ReplicaHooks(
        identity=ServeReplicaIdentity(),
        stats_reporter=BoardReporter(home_app, model=served.scope),
        kv_events=IndexPublisherFactory(
            served.pool_key(role),
            num_shards=config.routing.kv_index_shards,
            stride=config.routing.kv_index_stride,
            index_app=home_app if rollout else "",
        ),
        gang=gang_engine_factory(served.pool_for(role)),
        kv_token=BoardKVToken(home_app) if rollout else None,
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


def _pool_options(
    config: ClusterConfig, served: ServedModel, role: Role, rollout: bool
) -> dict[str, Any]:
    """A pool's deployment options plus its request router for the configured policy
    (``rollout``: in another app, at 0 replicas, following the running app's KV index)."""
    pool = served.pool_for(role)
    router_options: dict[str, Any] = {
        "model": served.scope,
        "index_shards": config.routing.kv_index_shards,
        "index_stride": config.routing.kv_index_stride,
        "hot_prefixes": config.routing.hot_prefixes.model_dump(),
        "deliver_copies": True,  # hot_prefix: the router calls holder and target
    }
    options = {**pool_deployment_options(pool), **gang_options(pool)}
    if rollout:
        router_options["index_app"] = config.cluster.app_name
        options.pop("num_replicas", None)  # the rollout grows it from 0 step by step
        options["autoscaling_config"] = idle_range(pool.expert_parallel)
    return {
        **options,
        "request_router_config": request_router_config(
            role,
            config.routing.policy,
            block_size=served.engine_for(role).block_size,
            options=router_options,
        ),
    }


def _deployment(cls: type, name: str, options: Mapping[str, Any]) -> Deployment:
    """``cls`` as a Serve deployment named ``name`` with ``options`` applied."""
    return serve.deployment(name=name)(cls).options(**options)


def build_pools_app(args: Mapping[str, Any]) -> Application:
    """Serve's builder entry point of a stepped rollout's second app: ``args["config"]`` is the
    new config (a YAML path or mapping; its ``cluster.app_name`` names the running app)."""
    _check_args(args)
    return build_pools_app_from_config(load_cluster_config(args["config"]))


def build_app(args: Mapping[str, Any]) -> Application:
    """Serve's builder entry point: ``args["config"]`` is a YAML path or a config mapping."""
    _check_args(args)
    return build_app_from_config(load_cluster_config(args["config"]))


def _check_args(args: Mapping[str, Any]) -> None:
    if "config" not in args:
        raise ConfigError("application args need 'config': a YAML path or mapping", param="config")
    unknown = sorted(set(args) - {"config"})
    if unknown:
        raise ConfigError(f"unknown application args: {', '.join(unknown)}", param=unknown[0])
