"""The ``Ingress`` Serve deployment: the OpenAI FastAPI app wired to the pools' handles.

The app itself (routes, SSE, errors, metrics) is ``cluster.ingress.create_app``; this class
builds it inside the replica (Serve's late-bound ``@serve.ingress()`` calls
``__serve_build_asgi_app__``) from the cluster config plus handles to Prefill, Decode and the
stats board (no Prefill handle when the config has no prefill pool). On shutdown it drains:
new requests get 503 while those in flight finish.

Routing wiring: :class:`SessionMiddleware` puts each request's session id (``x-session-id``
header or the body's ``user`` field) where the pool clients read it; the disaggregation
decision asks the decode routers' KV index copy how much of a prompt decode already caches
(``cached_prefix_blocks``); ``/metrics`` also renders the process's routing metrics
(:class:`RoutingCollector`), and :meth:`IngressDeployment.routing_snapshot` returns them as JSON.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.config_file import load_cluster_config
from cluster.ingress import RequestGate, create_app
from cluster.ingress_settings import build_ingress_settings
from cluster.routing.index_sync import cached_prefix_blocks
from cluster.routing.metrics import routing_metrics
from cluster.routing.sessions import extract_session_id
from cluster.serve_clients import (
    CURRENT_SESSION_ID,
    NoPrefillPool,
    PoolWatch,
    RoutingKeys,
    ServeDecodeClient,
    ServePrefillClient,
)
from engine.builtin import resolve_model
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0
"""How long a stopping ingress replica lets its requests in flight finish."""

_Scope = dict[str, Any]
_ASGIApp = Any


class SessionMiddleware:
    """ASGI middleware: sets :data:`CURRENT_SESSION_ID` for the request it wraps.

    The ``x-session-id`` header wins; otherwise a JSON POST body's ``user`` field, read only
    when the body declares a length within ``max_body_bytes`` (the body is replayed unchanged
    to the app, which still enforces its own limits)."""

    def __init__(self, app: _ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: _Scope, receive: Any, send: Any) -> None:
        """Handle one ASGI connection scope."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        session_id = extract_session_id(headers, {})
        if session_id is None and self._body_is_small_json(scope, headers):
            body, receive = await _buffered(receive)
            session_id = extract_session_id({}, _json_object(body))
        token = CURRENT_SESSION_ID.set(session_id)
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT_SESSION_ID.reset(token)

    def _body_is_small_json(self, scope: _Scope, headers: dict[str, str]) -> bool:
        length = headers.get("content-length", "")
        return (
            scope.get("method") == "POST"
            and length.isdigit()
            and 0 < int(length) <= self.max_body_bytes
            and "json" in headers.get("content-type", "json")
        )


async def _buffered(receive: Any) -> tuple[bytes, Any]:
    """The whole request body, and a ``receive`` that replays it."""
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    pending = list(messages)

    async def replay() -> Any:
        return pending.pop(0) if pending else await receive()

    return b"".join(chunks), replay


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class RoutingCollector(Collector):
    """The process's routing metrics in Prometheus form (see ``cluster.routing.metrics``)."""

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
        for pool, metrics in snapshot["pools"].items():
            for reason, count in metrics["decisions_total"].items():
                decisions.add_metric([pool, reason], count)
            hit_rate.add_metric([pool], metrics["prefix_hit_rate"])
            latency_p50.add_metric([pool], metrics["decision_latency_s"]["p50"])
        yield from (decisions, hit_rate, latency_p50)
        for key, value in snapshot["index"].items():
            yield GaugeMetricFamily(f"pdserve:kv_index_{key}", f"KV index {key}.", value=value)


@serve.ingress()
class IngressDeployment:
    """One ingress replica: tokenizer, admission gate, pool clients and the FastAPI app."""

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        prefill: DeploymentHandle | None,
        decode: DeploymentHandle,
        board: DeploymentHandle,
        config: dict[str, Any],
    ) -> None:
        cluster_config = load_cluster_config(config)
        model_dir = resolve_model(cluster_config.model.name)
        settings = build_ingress_settings(cluster_config, model_dir)
        self._watch = PoolWatch(board)
        self._watch.start()
        self._gate = RequestGate(settings.max_in_flight_requests, settings.retry_after_s)
        keys = RoutingKeys(settings.block_size, settings.hash_seed)
        app_name = serve.get_replica_context().app_name

        def cached_blocks(block_hashes: Sequence[int]) -> int:
            return cached_prefix_blocks(app_name, "decode", block_hashes)

        self._app = create_app(
            Tokenizer.from_dir(model_dir),
            ServePrefillClient(prefill, self._watch, keys) if prefill else NoPrefillPool(),
            ServeDecodeClient(decode, self._watch, keys),
            settings,
            stats_provider=self._watch.stats_by_role,
            cached_blocks_fn=cached_blocks,
            gate=self._gate,
        )
        self._app.state.metrics.registry.register(RoutingCollector())
        self._app.add_middleware(SessionMiddleware, max_body_bytes=settings.max_request_body_bytes)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The ASGI app Serve mounts for this replica."""
        return self._app

    async def routing_snapshot(self) -> dict[str, Any]:
        """The routing metrics of this replica's routers (``RoutingMetrics.snapshot``)."""
        return routing_metrics().snapshot()

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
