"""The FastAPI app factory: OpenAI routes, health and readiness, Prometheus metrics.

``create_app`` wires a tokenizer, the two pool clients and the settings into an app. Under Ray
Serve, the deploy helper builds it inside the ingress replica and returns it from
``__serve_build_asgi_app__`` of a class decorated with ``@serve.ingress()`` (Ray's late-bound
ingress), adapting Serve handles to :class:`PrefillClient` / :class:`DecodeClient`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.ingress.admission import RequestGate, authenticate
from cluster.ingress.clients import DecodeClient, PrefillClient, StatsProvider
from cluster.ingress.disagg import CachedBlocksFn, DisaggPolicy
from cluster.ingress.errors import error_body, error_response
from cluster.ingress.fault_routes import FaultAdmin, FaultRequest, add_fault_routes
from cluster.ingress.flow import GenerationFlow
from cluster.ingress.guards import IngressGuard
from cluster.ingress.handlers import GenerationHandlers
from cluster.ingress.metrics import ROLE, IngressMetrics
from cluster.ingress.openapi import describe_bodies, json_body
from cluster.ingress.prompts import PromptBuilder, PromptTokenizer
from cluster.ingress.schemas import ChatCompletionRequest, CompletionRequest
from cluster.ingress.settings import IngressSettings
from cluster.ingress.tokenize_routes import DetokenizeRequest, TokenizeRequest, add_tokenize_routes
from core.errors import PdserveError
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

logger = logging.getLogger(__name__)


def create_app(
    tokenizer: PromptTokenizer,
    prefill: PrefillClient,
    decode: DecodeClient,
    settings: IngressSettings,
    *,
    stats_provider: StatsProvider | None = None,
    cached_blocks_fn: CachedBlocksFn | None = None,
    gate: RequestGate | None = None,
    fault_admin: FaultAdmin | None = None,
) -> FastAPI:
    """The OpenAI-compatible ingress app (``app.state.gate`` drains it, ``app.state.metrics``)."""
    gate = gate or RequestGate(
        settings.server.max_in_flight_requests, settings.server.retry_after_s
    )
    metrics = IngressMetrics(settings.model_name)
    metrics.in_flight.labels(ROLE).set_function(lambda: float(gate.num_in_flight))
    policy = DisaggPolicy(
        settings.scheduler.local_prefill_threshold_tokens, settings.block_size, cached_blocks_fn
    )
    detokenizer = None
    if isinstance(tokenizer, Tokenizer):

        def detokenizer(prompt_ids: list[int]) -> IncrementalDetokenizer:
            return IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt_ids)

    flow = GenerationFlow(prefill, decode, policy, settings, metrics, detokenizer)
    metrics.degraded.labels("prefill_unavailable").set_function(
        lambda: float(settings.prefill_required and not flow.prefill_available())
    )
    handlers = GenerationHandlers(settings, PromptBuilder(tokenizer, settings), flow, gate, metrics)
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
    created = int(time.time())
    app.state.gate = gate
    app.state.metrics = metrics
    app.state.flow = flow
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
    add_tokenize_routes(app, tokenizer, settings, metrics)
    add_fault_routes(app, fault_admin)
    bodies: list[type[BaseModel]] = [
        CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest
    ]  # fmt: skip
    describe_bodies(app, bodies + ([FaultRequest] if fault_admin is not None else []))

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
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
                "max_model_len": settings.max_model_len,
            }
            for name in settings.served_model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    def parts() -> dict[str, bool]:
        return {
            "draining": gate.draining,
            "prefill": flow.prefill_available(),
            "decode": decode.healthy(),
        }

    def degraded(status: dict[str, bool]) -> list[str]:
        return (
            ["prefill_unavailable"] if settings.prefill_required and not status["prefill"] else []
        )

    @app.get("/health")
    async def health() -> Response:
        status = parts()
        return JSONResponse({"status": "ok", **status, "degraded": degraded(status)})

    @app.get("/ready")
    async def ready() -> Response:
        # NOTE: ready means "a request sent now is served": with local fallback, decode alone
        # serves every prompt, so a missing prefill pool only shows as degraded.
        status = parts()
        prefill_ok = (
            status["prefill"]
            or not settings.prefill_required
            or settings.scheduler.fallback_to_local_prefill
        )
        is_ready = not status["draining"] and prefill_ok and status["decode"]
        body = {
            "status": "ready" if is_ready else "not_ready",
            **status,
            "degraded": degraded(status),
        }
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
