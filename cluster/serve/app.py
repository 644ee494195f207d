"""The Ray Serve application builder: a ``ClusterConfig`` becomes four bound deployments.

``Prefill`` and ``Decode`` (one per pool, each with its own replica count or autoscaling range,
resources and node selector), the ``StatsBoard`` they report to, and the HTTP ``Ingress`` that
holds handles to the other three. Options come from the config through ``.options(...)``;
nothing is baked into decorators.

Routing: each pool gets a request router for ``scheduler.policy``
(``cluster.routing.router_config``) and its replicas publish their engine's KV events to the
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

from cluster.routing.index_actor import IndexPublisherFactory
from cluster.routing.router_config import request_router_config
from cluster.serve.config_file import config_to_mapping, load_cluster_config
from cluster.serve.gang import gang_engine_factory, gang_options
from cluster.serve.ingress import IngressDeployment
from cluster.serve.pool_options import (
    BOARD_DEPLOYMENT,
    DECODE_DEPLOYMENT,
    INGRESS_DEPLOYMENT,
    PREFILL_DEPLOYMENT,
    board_deployment_options,
    ingress_deployment_options,
    pool_deployment_options,
)
from cluster.serve.stats_board import BoardReporter, StatsBoard
from core.config import ClusterConfig, Role
from core.errors import ConfigError
from decode.deployment import DecodeDeployment
from prefill.deployment import PrefillDeployment
from replica.kv_token import KVToken


def build_app_from_config(config: ClusterConfig) -> Application:
    """The pdserve Serve application for ``config`` (deploy with ``serve.run``)."""
    model = config.model.model_dump(mode="json")
    transfer = config.transfer.model_dump(mode="json")
    kv_token = KVToken.for_deploy(config.transfer)
    reporter = BoardReporter(config.cluster.app_name)
    board = _deployment(StatsBoard, BOARD_DEPLOYMENT, board_deployment_options()).bind()
    prefill = None
    if config.prefill.deployed:
        prefill = _deployment(
            PrefillDeployment, PREFILL_DEPLOYMENT, _pool_options(config, "prefill")
        ).bind(
            model,
            config.engine_for("prefill").model_dump(mode="json"),
            transfer,
            reporter,
            IndexPublisherFactory("prefill"),
            gang_engine_factory(config.prefill),
            kv_token,
        )
    decode = _deployment(DecodeDeployment, DECODE_DEPLOYMENT, _pool_options(config, "decode")).bind(
        model,
        config.engine_for("decode").model_dump(mode="json"),
        transfer,
        config.decode.kv_failure_policy,
        reporter,
        IndexPublisherFactory("decode"),
        gang_engine_factory(config.decode),
        kv_token,
    )
    ingress = _deployment(
        IngressDeployment,
        INGRESS_DEPLOYMENT,
        ingress_deployment_options(
            config.server, reports_latency=config.scheduler.planner.mode == "slo"
        ),
    )
    return ingress.bind(prefill, decode, board, config_to_mapping(config))


def _pool_options(config: ClusterConfig, role: Role) -> dict[str, Any]:
    """A pool's deployment options plus its request router for the configured policy."""
    pool = config.pool_for(role)
    return {
        **pool_deployment_options(pool),
        **gang_options(pool),
        "request_router_config": request_router_config(
            role,
            config.scheduler.policy,
            block_size=config.engine_for(role).block_size,
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
