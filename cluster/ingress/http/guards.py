"""The ingress's outer ASGI guard: header size and API keys on every route, before routing.

* **Header size.** The request's header block (names, values and separators) larger than
  ``server.max_header_bytes`` is answered 400 before any handler runs — nginx answers an
  oversized header block the same way.
* **API keys.** With keys configured, every route needs one — ``/metrics``, ``/openapi.json`` and
  unknown paths included — except ``/health`` and ``/ready`` (probes carry no credentials) and
  the routes the config opens explicitly (``server.public_routes``, e.g. ``/metrics`` for a
  scraper). The generation handlers check the key again themselves; the guard is what makes
  the default closed for routes added later.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.ingress.http.api_keys import authenticate
from cluster.ingress.http.error_responses import error_body
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.errors import AuthenticationError

PROBE_ROUTES = frozenset({"/health", "/ready"})
"""Routes that never need a key."""


class IngressGuard:
    """ASGI middleware enforcing the header limit and API keys (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_header_bytes: int,
        api_keys: Collection[str],
        public_routes: Collection[str],
        metrics: IngressMetrics,
    ) -> None:
        self._app = app
        self._max_header_bytes = max_header_bytes
        self._api_keys = api_keys
        self._open = PROBE_ROUTES | frozenset(public_routes)
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        size = sum(len(name) + len(value) + 4 for name, value in headers)
        if size > self._max_header_bytes:
            self._metrics.count_rejected("headers_too_large")
            message = (
                f"the request headers take {size} bytes, more than the "
                f"{self._max_header_bytes} this server accepts"
            )
            await _send_json(send, 400, error_body(message, "invalid_request_error", 400))
            return
        if self._api_keys and scope.get("path", "") not in self._open:
            authorization = next(
                (value.decode("latin-1") for name, value in headers if name == b"authorization"),
                None,
            )
            try:
                authenticate(authorization, self._api_keys)
            except AuthenticationError as e:
                self._metrics.count_rejected("unauthorized")
                await _send_json(send, e.status_code, e.to_openai())
                return
        await self._app(scope, receive, send)


async def _send_json(send: Send, status: int, body: object) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
