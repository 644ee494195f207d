"""The ingress app factory: one FastAPI app over every served model, built from route groups.

``create_app`` wires each served model's tokenizer, pool clients and settings (a
:class:`ModelEndpoint`), and the virtual model names of the YAML, into one app: the outer guard
(header size, API keys), the error handlers, and the route groups (generation, models,
tokenizer, probes, metrics, and the fault-injection admin route when configured). It returns an
:class:`IngressApp`: the ASGI app plus the parts its owner drives (the admission gate, the
metrics, the model table). Under Ray Serve the ingress deployment builds it inside its replica
and returns ``IngressApp.asgi`` from ``__serve_build_asgi_app__`` (Ray's late-bound ingress).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import FastAPI
from pydantic import BaseModel

from cluster.ingress.app.fault_routes import FaultAdmin, FaultRequest, add_fault_routes
from cluster.ingress.app.generation_routes import add_generation_routes
from cluster.ingress.app.lora_routes import LoRAAdmin, add_lora_routes
from cluster.ingress.app.metrics_route import add_metrics_route
from cluster.ingress.app.model_routes import add_model_routes
from cluster.ingress.app.openapi import describe_bodies
from cluster.ingress.app.probe_routes import add_probe_routes
from cluster.ingress.app.tokenize_routes import (
    DetokenizeRequest,
    TokenizeRequest,
    add_tokenize_routes,
)
from cluster.ingress.dispatch.flow import GenerationFlow
from cluster.ingress.dispatch.pool_clients import StatsProvider
from cluster.ingress.http.error_handlers import add_error_handlers
from cluster.ingress.http.guards import IngressGuard
from cluster.ingress.http.request_gate import RequestGate
from cluster.ingress.model_routing.router import ModelRouter
from cluster.ingress.model_table import ModelEndpoint, ModelTable, build_route
from cluster.ingress.openai.handlers import GenerationHandlers
from cluster.ingress.openai.schemas import ChatCompletionRequest, CompletionRequest
from cluster.ingress.telemetry.request_metrics import ROLE, IngressMetrics
from core.config import VirtualModelConfig


@dataclass(frozen=True)
class IngressApp:
    """A built ingress: the ASGI app and the parts its owner (and tests) drive."""

    asgi: FastAPI
    gate: RequestGate
    """Admission: draining and the in-flight cap."""
    metrics: IngressMetrics
    """The per-app Prometheus registry and the recent latencies the planner reads."""
    table: ModelTable
    """Every served model's route, found by name."""

    @property
    def default_flow(self) -> GenerationFlow:
        """The flow of the model answering requests that name none."""
        return self.table.default.flow


def create_app(
    models: Sequence[ModelEndpoint],
    *,
    virtual_models: Sequence[VirtualModelConfig] = (),
    stats_provider: StatsProvider | None = None,
    gate: RequestGate | None = None,
    fault_admin: FaultAdmin | None = None,
    lora_admin: LoRAAdmin | None = None,
    metrics: IngressMetrics | None = None,
) -> IngressApp:
    """The OpenAI-compatible ingress over ``models`` (the first answers requests naming no
    model); ``gate`` defaults to one sized by the server settings; ``metrics`` to new ones (an
    app rebuilt in place passes its predecessor's: counters go on, the gauges follow it)."""
    settings = models[0].settings  # server, routing and API keys are the cluster's, shared
    gate = gate or RequestGate(
        settings.server.max_in_flight_requests, settings.server.retry_after_s
    )
    metrics = metrics or IngressMetrics(settings.model_name)
    metrics.in_flight.labels(ROLE).set_function(lambda: float(gate.num_in_flight))
    table = ModelTable([build_route(m, metrics) for m in models], virtual_models, lora_admin)

    def degraded_now() -> float:
        return float(any(r.health().degraded for r in table.routes))

    metrics.degraded.labels("prefill_unavailable").set_function(degraded_now)
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
    add_error_handlers(app)
    app.add_middleware(
        IngressGuard,
        max_header_bytes=settings.server.max_header_bytes,
        api_keys=settings.api_keys,
        public_routes=settings.server.public_routes,
        metrics=metrics,
    )
    handlers = GenerationHandlers(table, ModelRouter(table, metrics), gate, metrics)
    add_generation_routes(app, handlers)
    add_tokenize_routes(app, table, metrics)
    add_fault_routes(app, fault_admin)
    add_lora_routes(app, table, lora_admin)
    add_model_routes(app, table, settings, metrics)
    add_probe_routes(app, table, gate)
    add_metrics_route(app, metrics, stats_provider, settings.stats_timeout_s)
    bodies: list[type[BaseModel]] = [
        CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest
    ]  # fmt: skip
    describe_bodies(app, bodies + ([FaultRequest] if fault_admin is not None else []))
    return IngressApp(app, gate, metrics, table)
