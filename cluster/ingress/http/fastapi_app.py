"""The FastAPI app factory: OpenAI routes, health and readiness, Prometheus metrics.

``create_app`` wires each served model's tokenizer, pool clients and settings (a
:class:`ModelEndpoint`), and the virtual model names of the YAML, into one app. Under Ray
Serve, the deploy helper builds it inside the ingress replica and returns it from
``__serve_build_asgi_app__`` of a class decorated with ``@serve.ingress()`` (Ray's late-bound
ingress), adapting Serve handles to :class:`PrefillClient` / :class:`DecodeClient`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.ingress.dispatch.clients import StatsProvider
from cluster.ingress.http.admission import RequestGate, authenticate
from cluster.ingress.http.error_responses import error_body, error_response
from cluster.ingress.http.fault_routes import FaultAdmin, FaultRequest, add_fault_routes
from cluster.ingress.http.guards import IngressGuard
from cluster.ingress.http.openapi import describe_bodies, json_body
from cluster.ingress.http.tokenize_routes import (
    DetokenizeRequest,
    TokenizeRequest,
    add_tokenize_routes,
)
from cluster.ingress.model_routing.router import ModelRouter
from cluster.ingress.model_table import ModelEndpoint, ModelTable, build_route
from cluster.ingress.openai.handlers import GenerationHandlers
from cluster.ingress.openai.schemas import ChatCompletionRequest, CompletionRequest
from cluster.ingress.telemetry.request_metrics import ROLE, IngressMetrics
from core.config import VirtualModelConfig
from core.errors import PdserveError

logger = logging.getLogger(__name__)


def create_app(
    models: Sequence[ModelEndpoint],
    *,
    virtual_models: Sequence[VirtualModelConfig] = (),
    stats_provider: StatsProvider | None = None,
    gate: RequestGate | None = None,
    fault_admin: FaultAdmin | None = None,
) -> FastAPI:
    """The OpenAI-compatible ingress app over ``models`` (the first answers requests naming
    no model); ``app.state.gate`` drains it, ``app.state.metrics`` and ``app.state.table``."""
    settings = models[0].settings  # server, routing and API keys are the cluster's, shared
    gate = gate or RequestGate(
        settings.server.max_in_flight_requests, settings.server.retry_after_s
    )
    metrics = IngressMetrics(settings.model_name)
    metrics.in_flight.labels(ROLE).set_function(lambda: float(gate.num_in_flight))
    table = ModelTable([build_route(m, metrics) for m in models], virtual_models)

    def degraded_now() -> float:
        return float(any(r.health().degraded for r in table.routes))

    metrics.degraded.labels("prefill_unavailable").set_function(degraded_now)
    handlers = GenerationHandlers(table, ModelRouter(table, metrics), gate, metrics)
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
    created = int(time.time())
    app.state.gate = gate
    app.state.metrics = metrics
    app.state.table = table
    app.state.flow = table.default.flow
    _add_error_handlers(app)
    app.add_middleware(
        IngressGuard,
        max_header_bytes=settings.server.max_header_bytes,
        api_keys=settings.api_keys,
        public_routes=settings.server.public_routes,
        metrics=metrics,
    )

    app.add_api_route("/v1/completions", handlers.completions, methods=["POST"],
                      openapi_extra=json_body(CompletionRequest))  # fmt: skip
    app.add_api_route("/v1/chat/completions", handlers.chat_completions, methods=["POST"],
                      openapi_extra=json_body(ChatCompletionRequest))  # fmt: skip
    add_tokenize_routes(app, table, metrics)
    add_fault_routes(app, fault_admin)
    bodies: list[type[BaseModel]] = [
        CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest
    ]  # fmt: skip
    describe_bodies(app, bodies + ([FaultRequest] if fault_admin is not None else []))

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            authenticate(request.headers.get("authorization"), settings.api_keys)
        except PdserveError as e:
            metrics.count_rejected("unauthorized")
            return error_response(e)
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": settings.owned_by,
                "max_model_len": table.max_model_len(name),
            }
            for name in table.names()
        ]
        return JSONResponse({"object": "list", "data": data})

    def parts() -> dict[str, Any]:
        health = {r.name: r.health() for r in table.routes}
        status: dict[str, Any] = {
            "draining": gate.draining,
            "prefill": all(h.prefill for h in health.values()),
            "decode": all(h.decode for h in health.values()),
            "degraded": (
                ["prefill_unavailable"] if any(h.degraded for h in health.values()) else []
            ),
            "ready": not gate.draining and all(h.ready for h in health.values()),
        }
        if len(health) > 1:
            status["models"] = {
                name: {"prefill": h.prefill, "decode": h.decode} for name, h in health.items()
            }
        return status

    @app.get("/health")
    async def health() -> Response:
        status = parts()
        status.pop("ready")
        return JSONResponse({"status": "ok", **status})

    @app.get("/ready")
    async def ready() -> Response:
        # NOTE: ready means "a request sent now is served" for every model: with local
        # fallback, decode alone serves every prompt, so a missing prefill pool only shows as
        # degraded.
        status = parts()
        is_ready = status.pop("ready")
        body = {"status": "ready" if is_ready else "not_ready", **status}
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @app.get("/metrics")
    async def metrics_text() -> Response:
        if stats_provider is not None:
            try:
                async with asyncio.timeout(settings.stats_timeout_s):
                    metrics.worker_stats.update(await stats_provider())
            except Exception as e:  # stale worker stats must not break the scrape
                logger.warning("worker stats unavailable: %s: %s", type(e).__name__, e)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves in the OpenAI shape, even routing errors and bugs."""

    async def on_http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = error_body(str(exc.detail), error_type, exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def on_pdserve_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, PdserveError)
        return error_response(exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s", request.url.path, exc_info=exc)
        body = error_body(f"internal error: {type(exc).__name__}", "internal_error", 500)
        return JSONResponse(body, status_code=500)

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(PdserveError, on_pdserve_error)
    app.add_exception_handler(Exception, on_unexpected)
