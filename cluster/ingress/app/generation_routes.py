"""``POST /v1/completions`` and ``POST /v1/chat/completions``: the two generation endpoints,
their bodies described in ``/openapi.json`` (the handlers read and validate the body
themselves, so a bad body becomes an OpenAI-shaped 400)."""

from __future__ import annotations

from fastapi import FastAPI

from cluster.ingress.app.openapi import json_body
from cluster.ingress.openai.handlers import GenerationHandlers
from cluster.ingress.openai.schemas import ChatCompletionRequest, CompletionRequest


def add_generation_routes(app: FastAPI, handlers: GenerationHandlers) -> None:
    """Mount ``handlers`` on the OpenAI paths."""
    app.add_api_route(
        "/v1/completions",
        handlers.completions,
        methods=["POST"],
        openapi_extra=json_body(CompletionRequest),
    )
    app.add_api_route(
        "/v1/chat/completions",
        handlers.chat_completions,
        methods=["POST"],
        openapi_extra=json_body(ChatCompletionRequest),
    )
