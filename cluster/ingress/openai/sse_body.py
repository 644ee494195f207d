"""The SSE body of a generation stream, one or many choices.

A chunk per delta (tagged with its choice index), the usage chunk with ``include_usage`` (the
usage so far on every chunk with ``continuous_usage_stats``), then ``[DONE]``. A failure after
the first chunk becomes an SSE error event followed by ``[DONE]`` — never a stream that just
stops.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator

from cluster.ingress.dispatch.deltas import Delta, RequestUsage
from cluster.ingress.dispatch.flow import RequestRun
from cluster.ingress.http.error_responses import error_body
from cluster.ingress.http.event_stream import SSE_DONE, sse_event
from cluster.ingress.http.public_errors import for_client
from cluster.ingress.openai.choices import total_usage
from cluster.ingress.openai.responses import Echo, ResponseRenderer
from cluster.ingress.openai.schemas import GenerationRequest
from core.errors import PdserveError

logger = logging.getLogger(__name__)


class SSEStream:
    """The SSE body of a (possibly multi-choice) stream: a chunk per delta, the usage chunk,
    ``[DONE]`` — never just stopping."""

    def __init__(
        self,
        renderer: ResponseRenderer,
        body: GenerationRequest,
        echoes: list[Echo | None],
        runs: list[RequestRun],
    ) -> None:
        self._renderer, self._body, self._echoes, self._runs = renderer, body, echoes, runs

    def _chunk(self, index: int, delta: Delta) -> bytes:
        usage = self._usage() if self._body.continuous_usage else None
        echo = self._echoes[index // self._body.num_choices]
        return sse_event(
            self._renderer.chunk(
                delta, include_usage=self._body.include_usage, index=index, echo=echo, usage=usage
            )
        )

    def _usage(self) -> RequestUsage:
        return total_usage(self._runs, len(self._echoes))

    async def body(
        self, first: tuple[int, Delta], events: AsyncIterator[tuple[int, Delta]]
    ) -> AsyncGenerator[bytes, None]:
        request_id = self._renderer.response_id
        try:
            yield self._chunk(*first)
            async for index, delta in events:
                if delta.token_ids or delta.finish_reason is not None:
                    yield self._chunk(index, delta)
            if self._body.include_usage:
                yield sse_event(self._renderer.usage_chunk(self._usage()))
        except PdserveError as e:
            logger.warning("request %s failed mid-stream: %s", request_id, e.message)
            yield sse_event(for_client(e, request_id).to_openai())
        except TimeoutError:
            logger.warning("request %s timed out mid-stream", request_id)
            yield sse_event(error_body(f"request {request_id} timed out", "timeout_error", 408))
        yield SSE_DONE
