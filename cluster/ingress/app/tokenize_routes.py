"""``POST /tokenize``, ``POST /detokenize`` and ``GET /version`` in vLLM's shapes.

``/tokenize`` takes ``{"model", "prompt", "add_special_tokens"}`` (completion style: special
tokens such as BOS are added unless ``add_special_tokens`` is false, exactly as
``/v1/completions`` would) or ``{"model", "messages", "add_generation_prompt",
"add_special_tokens", "chat_template_kwargs"}`` (chat style: the chat template is applied, no
special tokens added by default, as ``/v1/chat/completions`` does) and answers ``{"count",
"max_model_len", "tokens", "token_strs"}``. ``/detokenize`` takes ``{"model", "tokens"}`` and
answers ``{"prompt"}``. Neither checks the prompt against ``max_model_len``: a client asks
precisely to learn whether its prompt fits. API keys, the body-size limit and the model-name
check are those of the generation routes; nothing reaches a worker. ``/version`` answers
``{"version"}``, the installed pdserve package's.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cluster.ingress.app.openapi import json_body
from cluster.ingress.http.api_keys import authenticate
from cluster.ingress.http.error_responses import (
    error_response,
    from_validation_error,
    rejection_reason,
    too_large_response,
)
from cluster.ingress.http.json_body import parse_json_object
from cluster.ingress.model_table import ModelTable
from cluster.ingress.prompt_tokenizer import PromptTokenizer
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.errors import InvalidRequestError, PdserveError

M = TypeVar("M", bound=BaseModel)


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: a ``prompt`` or chat ``messages`` (exactly one of them)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids back to text."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int] = Field(..., description="Token ids to decode.")


class TokenizeRoutes:
    """The two handlers, with the tokenizer of the model a request names (the first model's
    when it names none; a virtual name's default model's)."""

    def __init__(self, table: ModelTable, metrics: IngressMetrics) -> None:
        self._table = table
        self._settings = table.default.settings  # the server section all models share
        self._metrics = metrics

    async def tokenize(self, request: Request) -> Response:
        """``POST /tokenize``."""
        try:
            body = await self._parse(request, TokenizeRequest)
            await self._table.sync(body.model)
            route = self._table.find(body.model)
            ids = self._token_ids(route.tokenizer, body)
        except PdserveError as e:
            return self._reject(e)
        except _TooLargeError:
            return self._too_large()
        token_strs = [route.tokenizer.id_to_token(t) or "" for t in ids]
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": route.settings.max_model_len,
                "tokens": ids,
                "token_strs": token_strs if body.return_token_strs else None,
            }
        )

    async def detokenize(self, request: Request) -> Response:
        """``POST /detokenize``."""
        try:
            body = await self._parse(request, DetokenizeRequest)
            await self._table.sync(body.model)
            tokenizer = self._table.find(body.model).tokenizer
            vocab = tokenizer.vocab_size
            if any(not 0 <= t < vocab for t in body.tokens):
                raise InvalidRequestError(f"tokens must be in [0, {vocab})", param="tokens")
        except PdserveError as e:
            return self._reject(e)
        except _TooLargeError:
            return self._too_large()
        return JSONResponse({"prompt": tokenizer.decode(body.tokens)})

    def _token_ids(self, tokenizer: PromptTokenizer, body: TokenizeRequest) -> list[int]:
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequestError("give exactly one of prompt and messages", param="prompt")
        if body.prompt is not None:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            return tokenizer.encode(body.prompt, add_special_tokens=special)
        assert body.messages is not None
        text = tokenizer.apply_chat_template(
            body.messages,
            add_generation_prompt=body.add_generation_prompt,
            template_kwargs=body.chat_template_kwargs,
        )
        return tokenizer.encode(text, add_special_tokens=bool(body.add_special_tokens))

    async def _parse(self, request: Request, model: type[M]) -> M:
        authenticate(request.headers.get("authorization"), self._settings.api_keys)
        limit = self._settings.server.max_request_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _TooLargeError
        raw = await request.body()
        if len(raw) > limit:
            raise _TooLargeError
        try:
            body = model.model_validate(parse_json_object(raw))
        except ValidationError as e:
            raise from_validation_error(e) from e
        return body

    def _reject(self, e: PdserveError) -> JSONResponse:
        self._metrics.count_rejected(rejection_reason(e))
        return error_response(e)

    def _too_large(self) -> JSONResponse:
        self._metrics.count_rejected("body_too_large")
        return too_large_response(self._settings.server.max_request_body_bytes)


class _TooLargeError(Exception):
    """The body is over ``max_request_body_bytes`` (answered with a 413)."""


def add_tokenize_routes(app: FastAPI, table: ModelTable, metrics: IngressMetrics) -> None:
    """Mount ``/tokenize``, ``/detokenize`` and ``/version`` on ``app``."""
    routes = TokenizeRoutes(table, metrics)
    app.add_api_route("/tokenize", routes.tokenize, methods=["POST"],
                      openapi_extra=json_body(TokenizeRequest))  # fmt: skip
    app.add_api_route("/detokenize", routes.detokenize, methods=["POST"],
                      openapi_extra=json_body(DetokenizeRequest))  # fmt: skip
    app.add_api_route("/version", version, methods=["GET"])


async def version() -> JSONResponse:
    """``GET /version``."""
    try:
        installed = importlib.metadata.version("pdserve")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was not installed
        installed = "0+unknown"
    return JSONResponse({"version": installed})
