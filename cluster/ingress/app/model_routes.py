"""``GET /v1/models``: every served and virtual model name, in the OpenAI list shape (plus vLLM's
``max_model_len``), then every LoRA adapter with its base model as ``parent`` (vLLM's shape):
the YAML's and those loaded at run time through any ingress (the registry is re-read when this
ingress's view is older than its ``max_age_s``)."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from cluster.ingress.http.api_keys import authenticate
from cluster.ingress.http.error_responses import error_response
from cluster.ingress.model_table import ModelTable
from cluster.ingress.settings import IngressSettings
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.errors import PdserveError


def add_model_routes(
    app: FastAPI, table: ModelTable, settings: IngressSettings, metrics: IngressMetrics
) -> None:
    """``/v1/models`` over ``table``; API keys as on the generation routes."""
    created = int(time.time())

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            authenticate(request.headers.get("authorization"), settings.api_keys)
        except PdserveError as e:
            metrics.count_rejected("unauthorized")
            return error_response(e)
        await table.adapters.sync_all()
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
        data += [
            {
                "id": adapter.name,
                "object": "model",
                "created": created,
                "owned_by": settings.owned_by,
                "root": adapter.path,
                "parent": adapter.base,
                "max_model_len": table.max_model_len(adapter.base),
            }
            for adapter in table.adapters.all()
        ]
        return JSONResponse({"object": "list", "data": data})
