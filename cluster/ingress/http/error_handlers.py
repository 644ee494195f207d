"""Every error leaves the ingress in the OpenAI shape, even routing errors and bugs."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.ingress.http.error_responses import error_body, error_response
from core.errors import PdserveError

logger = logging.getLogger(__name__)


def add_error_handlers(app: FastAPI) -> None:
    """Starlette's HTTP errors, typed pdserve errors and anything unexpected, as OpenAI bodies."""

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
