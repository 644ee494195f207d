"""The ``Ingress`` Serve deployment: the OpenAI FastAPI app wired to the pools' handles.

The app itself (routes, SSE, errors, metrics) is ``cluster.ingress.create_app``; this class
builds it inside the replica (Serve's late-bound ``@serve.ingress()`` calls
``__serve_build_asgi_app__``) from the cluster config plus handles to each served model's
Prefill and Decode (no Prefill handle for a model without a prefill pool) and the stats
board. On shutdown it drains: new requests get 503 while those in flight finish.

Routing wiring: the ingress computes each request's ``RoutingKeys`` (block hashes, session id)
once and the pools' request routers read them from the request; the disaggregation decision asks
the ingress's own follower of the app's KV index (an :class:`ActorIndexSource` it owns) how much
of a prompt the decode pool already caches. ``/metrics`` also renders the process's routing
metrics (:class:`RoutingCollector`), and :meth:`IngressDeployment.routing_snapshot` returns them
as a plain ``RoutingSnapshot``.

In place: Serve calls :meth:`IngressDeployment.reconfigure` with the Ingress deployment's
``user_config`` (what ``pdserve upgrade`` sets for the fields that apply in place); the replica
rebuilds its app and swaps it behind the ASGI app Serve mounted, publishes the routing knobs to
the pools' routers in its process (``cluster.routing.live_settings``) and the planner's settings
to the app's planner (``cluster.serve.planner_settings``), restarting nothing.
The same ``user_config`` names the apps whose pools serve each model after stepped rollouts
(``cluster.serve.rollout_pools.FOLLOW_KEY``): a model served from any app but the running one
gets versioned pool clients (``cluster.ingress.dispatch.versioned_pools``), one per app, that
send each request to the app whose replicas run its fingerprint.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.ingress import IngressApp, RequestGate, create_app
from cluster.ingress.dispatch.pool_clients import DecodeClient, PrefillClient
from cluster.ingress.dispatch.versioned_pools import VersionedDecodeClient, VersionedPrefillClient
from cluster.ingress.model_table import ModelEndpoint
from cluster.routing import live_settings
from cluster.routing.kv_index.actor import INDEX_NAMESPACE
from cluster.routing.kv_index.follower import ActorIndexSource
from cluster.routing.live_settings import LiveRouting
from cluster.routing.routing_metrics import RoutingMetrics, routing_metrics
from cluster.serve import planner_settings
from cluster.serve.clients import (
    NoPrefillPool,
    PoolVersions,
    PoolWatch,
    ServeDecodeClient,
    ServePrefillClient,
)
from cluster.serve.config_file import load_cluster_config
from cluster.serve.controller_watch import ControllerWatch
from cluster.serve.fault_admin import ServeFaultAdmin
from cluster.serve.in_place import with_in_place
from cluster.serve.ingress_setup import build_ingress_settings
from cluster.serve.lora_admin import ServeLoRAAdmin
from cluster.serve.planner_settings import PlannerSettings
from cluster.serve.pool_options import pool_deployment_name
from cluster.serve.rollout_pools import split_user_config
from cluster.serve.swappable_asgi import SwappableAsgi
from core.codec import to_plain
from core.config import ClusterConfig, ServedModel
from engine.builtin import resolve_model
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0
"""How long a stopping ingress replica lets its requests in flight finish."""


class RoutingCollector(Collector):
    """The process's routing metrics in Prometheus form (``cluster.routing.routing_metrics``)."""

    def collect(self) -> Iterator[Metric]:
        """One family per metric, labelled by pool (and reason)."""
        snapshot = routing_metrics().snapshot()
        decisions = CounterMetricFamily(
            "pdserve:routing_decisions", "Routing decisions.", labels=["pool", "reason"]
        )
        hit_rate = GaugeMetricFamily(
            "pdserve:routing_prefix_hit_rate",
            "Cached over prompt blocks at the chosen replica.",
            labels=["pool"],
        )
        latency_p50 = GaugeMetricFamily(
            "pdserve:routing_decision_seconds_p50",
            "Median routing decision time (recent decisions).",
            labels=["pool"],
        )
        prompt_blocks = CounterMetricFamily(
            "pdserve:routing_prompt_blocks",
            "Prompt blocks of routed requests (the hit rate's denominator: rate() over a window).",
            labels=["pool"],
        )
        cached_blocks = CounterMetricFamily(
            "pdserve:routing_cached_blocks",
            "Of those, blocks cached at the chosen replica.",
            labels=["pool"],
        )
        hot = GaugeMetricFamily(
            "pdserve:hot_prefixes", "Prefixes with a deliberate KV copy now.", labels=["pool"]
        )
        copies = {
            "made": CounterMetricFamily(
                "pdserve:prefix_copies_made", "Deliberate hot-prefix copies made.", labels=["pool"]
            ),
            "dropped": CounterMetricFamily(
                "pdserve:prefix_copies_dropped",
                "Deliberate hot-prefix copies retired, given up or lost.",
                labels=["pool"],
            ),
            "bytes": CounterMetricFamily(
                "pdserve:prefix_copy_bytes", "KV bytes of deliberate copies.", labels=["pool"]
            ),
        }
        policy = GaugeMetricFamily(
            "pdserve:routing_policy",
            "1 for the policy each pool's router ranks by now.",
            labels=["pool", "policy"],
        )
        for pool, metrics in snapshot.pools.items():
            if metrics.policy:
                policy.add_metric([pool, metrics.policy], 1)
            hot.add_metric([pool], metrics.hot_prefixes)
            copies["made"].add_metric([pool], metrics.prefix_copies_made_total)
            copies["dropped"].add_metric([pool], metrics.prefix_copies_dropped_total)
            copies["bytes"].add_metric([pool], metrics.prefix_copy_bytes_total)
            for reason, count in metrics.decisions_total.items():
                decisions.add_metric([pool, reason], count)
            hit_rate.add_metric([pool], metrics.prefix_hit_rate)
            latency_p50.add_metric([pool], metrics.decision_latency_s.p50)
            prompt_blocks.add_metric([pool], metrics.prompt_blocks_total)
            cached_blocks.add_metric([pool], metrics.cached_blocks_total)
        shard_losses = CounterMetricFamily(
            "pdserve:kv_index_shard_losses",
            "Times an unreachable KV index shard's replicas were routed by load only.",
            value=snapshot.index_shard_losses_total,
        )
        restarts = CounterMetricFamily(
            "pdserve:kv_index_restarts",
            "Times a KV index shard was found restarted and reloaded.",
            value=snapshot.index_restarts_total,
        )
        yield from (decisions, hit_rate, latency_p50, prompt_blocks, cached_blocks)
        yield from (shard_losses, restarts, hot, policy, *copies.values())
        if snapshot.index is not None:
            for key, value in dataclasses.asdict(snapshot.index).items():
                yield GaugeMetricFamily(f"pdserve:kv_index_{key}", f"KV index {key}.", value=value)


class ControlPlaneCollector(Collector):
    """How this ingress saw the control plane fare: the stats board (``PoolWatch``) and Serve's
    controller (``ControllerWatch``)."""

    def __init__(self, watch: PoolWatch, controller: ControllerWatch) -> None:
        self._watch = watch
        self._controller = controller

    def collect(self) -> Iterator[Metric]:
        """Restarts seen and probes that found each one unreachable."""
        board, controller = self._watch, self._controller
        for name, text, value in (
            ("stats_board_restarts", "Times the stats board answered as a new instance (Serve "
             "replaced it).", board.restarts_total),
            ("stats_board_unavailable", "Refreshes of the pools' live view that found the "
             "stats board unreachable.", board.unavailable_total),
            ("serve_controller_restarts", "Times Serve's controller answered from a new process "
             "(Ray restarted it).", controller.restarts_total),
            ("serve_controller_unavailable", "Probes of Serve's controller that failed or timed "
             "out.", controller.unavailable_total),
        ):  # fmt: skip
            yield CounterMetricFamily(f"pdserve:{name}", text, value=value)


def lora_admin(board: DeploymentHandle, config: ClusterConfig) -> ServeLoRAAdmin | None:
    """The runtime LoRA admin over the models that serve adapters (None: none does, the routes
    are off)."""
    scopes = {m.name: m.scope for m in config.served_models() if m.engine_for("decode").enable_lora}
    return ServeLoRAAdmin(board, scopes) if scopes else None


@serve.ingress()
class IngressDeployment:
    """One ingress replica: tokenizer, admission gate, pool clients and the FastAPI app."""

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        pools: dict[str, tuple[DeploymentHandle | None, DeploymentHandle]],
        board: DeploymentHandle,
        config: dict[str, Any],
    ) -> None:
        cluster_config = load_cluster_config(config)
        self._watch = PoolWatch(board)
        self._watch.start()
        self._controller = ControllerWatch()
        self._controller.start()
        self._gate = RequestGate(
            cluster_config.server.max_in_flight_requests, cluster_config.server.retry_after_s
        )
        self._app_name = serve.get_replica_context().app_name
        self._index = ActorIndexSource(
            self._app_name,
            namespace=INDEX_NAMESPACE,
            metrics=RoutingMetrics(),
            num_shards=cluster_config.routing.kv_index_shards,
            stride=cluster_config.routing.kv_index_stride,
        )
        self._index.ensure_started()
        self._pools, self._board = pools, board
        self._pools_apps: dict[str, list[str]] = {}  # served name -> apps serving it
        self._base_config = self._config = cluster_config
        self._publish_planner_settings(cluster_config)  # over any an earlier deploy left
        self._ingress = self._build_ingress(cluster_config)
        self._asgi = SwappableAsgi(self._ingress.asgi)

    def _build_ingress(
        self, cluster_config: ClusterConfig, previous: IngressApp | None = None
    ) -> IngressApp:
        """The FastAPI app for ``cluster_config`` over this replica's pools, with ``previous``'s
        metrics (an in-place rebuild: counters go on) or new ones."""
        pools, board = self._pools, self._board
        ingress = create_app(
            [
                self._endpoint(cluster_config, s, *pools[s.name])
                for s in cluster_config.served_models()
            ],
            virtual_models=cluster_config.virtual_models,
            stats_provider=self._watch.stats_by_role,
            gate=self._gate,
            fault_admin=ServeFaultAdmin(board) if cluster_config.server.fault_injection else None,
            lora_admin=lora_admin(board, cluster_config),
            metrics=None if previous is None else previous.metrics,
        )
        if previous is None:  # a rebuilt app keeps these, registered once
            registry = ingress.metrics.registry
            registry.register(RoutingCollector())
            registry.register(ControlPlaneCollector(self._watch, self._controller))
            ProcessCollector(registry=registry)  # process_start_time_seconds: restarts
        return ingress

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's lightweight update (``pdserve upgrade`` of the fields that apply in place,
        ``cluster.serve.in_place``): rebuild the app from the deployed config overlaid with
        ``user_config`` and serve the next requests from it, and hand the routing knobs and
        the planner's settings on; requests in flight finish on the old app, and no replica
        restarts. The rebuilt app keeps the metrics: counters go on across it."""
        fields, pools_apps = split_user_config(user_config, self._app_name)
        config = with_in_place(self._base_config, fields)
        if config == self._config and pools_apps == self._pools_apps:
            return
        live_settings.publish(self._app_name, LiveRouting.of(config.routing))
        self._publish_planner_settings(config)
        self._pools_apps = pools_apps
        self._ingress = self._build_ingress(config, previous=self._ingress)
        self._config = config
        self._asgi.swap(self._ingress.asgi)
        logger.info("ingress reconfigured in place: %s", ", ".join(sorted(user_config)))

    def _publish_planner_settings(self, config: ClusterConfig) -> None:
        """``config``'s planner settings for the app's planner (none runs with mode off)."""
        if config.planner.mode != "off":
            deployed = PlannerSettings.of(self._base_config)
            planner_settings.publish(self._app_name, deployed, PlannerSettings.of(config))

    def _endpoint(
        self,
        config: ClusterConfig,
        served: ServedModel,
        prefill: DeploymentHandle | None,
        decode: DeploymentHandle,
    ) -> ModelEndpoint:
        """One model's tokenizer, pool clients and settings."""
        model_dir = resolve_model(served.model.name)
        decode_pool = served.pool_key("decode")

        def cached_blocks(block_hashes: Sequence[int]) -> int:
            return self._index.best_match(decode_pool, block_hashes)

        prefill_client: PrefillClient = NoPrefillPool()
        if prefill is not None:
            prefill_client = ServePrefillClient(prefill, self._watch, served.pool_key("prefill"))
        decode_client: DecodeClient = ServeDecodeClient(decode, self._watch, decode_pool)
        apps = self._pools_apps.get(served.name, [])
        if apps and apps != [self._app_name]:
            prefill_client, decode_client = self._versioned_clients(
                served, apps, prefill_client, decode_client
            )
        return ModelEndpoint(
            Tokenizer.from_dir(model_dir),
            prefill_client,
            decode_client,
            build_ingress_settings(config, served, model_dir),
            cached_blocks,
            PoolVersions(self._watch, served.pool_key("prefill"), decode_pool),
        )

    def _versioned_clients(
        self,
        served: ServedModel,
        apps: list[str],
        prefill: PrefillClient,
        decode: DecodeClient,
    ) -> tuple[PrefillClient, DecodeClient]:
        """``served``'s pool clients over the running app's pools and those of ``apps`` (the
        apps stepped rollouts run its versions in), each request sent by its fingerprint; the
        first of ``apps`` takes those of no known version."""
        home = self._app_name
        prefill_pool, decode_pool = served.pool_key("prefill"), served.pool_key("decode")
        others = [app for app in apps if app != home]

        def handle(role: str, app: str) -> DeploymentHandle:
            return serve.get_deployment_handle(pool_deployment_name(role, served.scope), app)

        decodes: dict[str, DecodeClient] = {home: decode}
        for app in others:
            decodes[app] = ServeDecodeClient(handle("decode", app), self._watch, decode_pool)
        decode = VersionedDecodeClient(decodes, apps[0], partial(self._watch.app_of, decode_pool))
        if isinstance(prefill, NoPrefillPool):  # the model prefills on decode in every app
            return prefill, decode
        prefills: dict[str, PrefillClient] = {home: prefill}
        for app in others:
            prefills[app] = ServePrefillClient(handle("prefill", app), self._watch, prefill_pool)
        of_app = partial(self._watch.app_of, prefill_pool)
        return VersionedPrefillClient(prefills, apps[0], of_app), decode

    def __serve_build_asgi_app__(self) -> SwappableAsgi:
        """The ASGI app Serve mounts for this replica (it forwards to the current one)."""
        return self._asgi

    async def routing_snapshot(self) -> dict[str, Any]:
        """The routing metrics of this replica's routers: a plain ``RoutingSnapshot``."""
        plain: dict[str, Any] = to_plain(routing_metrics().snapshot())
        return plain

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics hook (called when the planner runs in ``slo``
        mode, which gives the ingress a fixed autoscaling range): the p90 TTFT and ITL clients
        saw over the last half minute, the latencies the planner corrects its model by."""
        metrics = self._ingress.metrics
        ttft, itl = metrics.recent_ttft.percentile(90), metrics.recent_itl.percentile(90)
        stats = {}
        if ttft is not None:
            stats["ttft_p90_s"] = ttft
        if itl is not None:
            stats["itl_p90_s"] = itl
        return stats

    async def set_draining(self, draining: bool) -> bool:
        """Refuse (True) or accept again (False) new requests; returns the new state."""
        if draining:
            self._gate.start_draining()
        else:
            self._gate.stop_draining()
        return self._gate.draining

    async def __del__(self) -> None:
        """Serve calls this when the replica stops: drain, then stop watching the pools."""
        self._gate.start_draining()
        if not await self._gate.wait_idle(DRAIN_TIMEOUT_S):
            logger.warning("ingress stopped with %d requests in flight", self._gate.num_in_flight)
        self._watch.stop()
        self._controller.stop()
        self._index.stop()
