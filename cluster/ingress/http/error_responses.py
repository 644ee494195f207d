"""OpenAI-shaped error responses: ``{"error": {"message", "type", "param", "code"}}``.

Typed ``core.errors`` exceptions render through their ``to_openai()``; pydantic validation
errors become a 400 naming the field path (``messages[0].role``); a 429 carries
``Retry-After``. Mid-stream failures render as an SSE error event (see
``cluster.ingress.openai.sse_body``).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from core.errors import (
    AuthenticationError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PdserveError,
    PromptTooLongError,
    SamplingParamsError,
    UnavailableError,
)

_REASONS: tuple[tuple[type[PdserveError], str], ...] = (
    (AuthenticationError, "unauthorized"),
    (OverloadedError, "overloaded"),
    (UnavailableError, "unavailable"),
    (ModelNotFoundError, "model_not_found"),
    (PromptTooLongError, "prompt_too_long"),
    (SamplingParamsError, "invalid_sampling_params"),
    (InvalidRequestError, "invalid_request"),
)


def error_body(
    message: str, error_type: str, status_code: int, param: str | None = None
) -> dict[str, dict[str, Any]]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": status_code}}


def error_response(exc: PdserveError, headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON error response with the exception's status (and ``Retry-After`` for a 429)."""
    all_headers = dict(headers or {})
    if isinstance(exc, OverloadedError):
        all_headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return JSONResponse(exc.to_openai(), status_code=exc.status_code, headers=all_headers)


def status_response(
    status_code: int,
    error_type: str,
    message: str,
    *,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error response for a status no typed error carries (408, 413)."""
    body = error_body(message, error_type, status_code, param)
    return JSONResponse(body, status_code=status_code, headers=headers)


def timeout_response(message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """408: the request did not complete within its deadline."""
    return status_response(408, "timeout_error", message, headers=headers)


def too_large_response(limit_bytes: int, headers: dict[str, str] | None = None) -> JSONResponse:
    """413: the request body exceeds ``limit_bytes``."""
    message = f"request body exceeds {limit_bytes} bytes"
    return status_response(413, "invalid_request_error", message, headers=headers)


def from_validation_error(e: ValidationError) -> InvalidRequestError:
    """The first pydantic error as a 400 naming its field path."""
    first = e.errors(include_url=False)[0]
    param = field_path(first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return InvalidRequestError(f"{param or 'body'}: {message}", param=param or None)


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """``("messages", 0, "role")`` -> ``"messages[0].role"``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def rejection_reason(exc: PdserveError) -> str:
    """A short label for the ``requests_rejected_total`` / failures counters."""
    for cls, reason in _REASONS:
        if isinstance(exc, cls):
            return reason
    return exc.error_type
