"""Server-sent events: framing, and a response that always cleans up after itself.

Each event is ``data: <json>\\n\\n``; a stream ends with ``data: [DONE]\\n\\n``, after an
``data: {"error": ...}`` event when it failed mid-way. :class:`EventStreamResponse` runs its
cleanup (closing the generation, which aborts it upstream, and releasing the request's
admission slot) however the response ends: completed, client disconnected, or task cancelled.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One SSE ``data:`` event holding ``payload`` as compact JSON."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + data.encode() + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` whose ``on_close`` runs exactly once, whatever ends the stream."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        on_close: Callable[[], Awaitable[None]],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(events, headers={**SSE_HEADERS, **(headers or {})})
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the events; then close them and run ``on_close`` even on cancellation."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._events.aclose()
            finally:
                await self._on_close()
