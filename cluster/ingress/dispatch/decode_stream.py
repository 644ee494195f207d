"""One decode call's deltas: each chunk the decode replica streams, checked and recorded.

Every wait for a chunk is bounded by ``chunk_timeout_s``; a replica that dies surfaces as
:class:`~core.errors.UnavailableError` (whatever it raised), and so does a stream that ends
early or ends with a server-side abort, so the caller can migrate it (a
:class:`~cluster.ingress.dispatch.migration.HandedOffError` when the abort carries a leaving
replica's export of the request's blocks). The stream is closed
however the read ends, which aborts the request on its replica and frees its blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator

from cluster.ingress.dispatch.deltas import Delta
from cluster.ingress.dispatch.migration import HandedOffError, ResumedText
from cluster.ingress.dispatch.open_decode import OpenDecode, close
from cluster.ingress.dispatch.pool_clients import DecodeClient
from cluster.ingress.dispatch.run_accounting import RunAccounting
from core.errors import PdserveError, UnavailableError
from core.messages import DecodeRequest, TokenChunk

logger = logging.getLogger(__name__)

_FAILED_FINISH_REASONS = frozenset({"abort", "error"})
"""Finish reasons of a decode chunk that mean the request failed rather than finished."""


class DecodeStream:
    """Reads decode calls of one request into deltas recorded by its accounting."""

    def __init__(
        self,
        decode: DecodeClient,
        accounting: RunAccounting,
        request_id: str,
        chunk_timeout_s: float,
    ) -> None:
        self._decode = decode
        self._accounting = accounting
        self._request_id = request_id
        self._chunk_timeout_s = chunk_timeout_s

    async def deltas(
        self, request: DecodeRequest, opened: OpenDecode | None, resumed: ResumedText | None
    ) -> AsyncGenerator[Delta, None]:
        """The deltas of ``request`` (on ``opened`` when the call already started); after a
        migration ``resumed`` renders their text."""
        accounting = self._accounting
        stream = self._decode.generate(request) if opened is None else opened.stream
        pending = None if opened is None else opened.first
        try:
            while True:
                chunk = await self._next_chunk(stream, pending)
                pending = None
                if chunk.error is not None:
                    raise chunk.error.to_error()
                if chunk.finished and chunk.finish_reason == "abort" and chunk.handoff:
                    raise HandedOffError(
                        f"request {self._request_id} was handed off by its leaving decode replica",
                        chunk.handoff,
                    )
                if chunk.finished and chunk.finish_reason in _FAILED_FINISH_REASONS:
                    # NOTE: the ingress aborts only for a client that left; an abort seen here is
                    # the server's doing, so the client must not mistake it for a short answer.
                    raise UnavailableError(
                        f"request {self._request_id} ended on the decode worker "
                        f"({chunk.finish_reason})"
                    )
                if request.kv_handle is None and not accounting.sent_token_ids:
                    accounting.prefill_reported(chunk.num_cached_tokens, chunk.stage_times)
                elif chunk.stage_times is not None and request.kv_handle is not None:
                    accounting.import_reported(chunk.stage_times)
                finish_reason = (chunk.finish_reason or "stop") if chunk.finished else None
                text = chunk.text
                if resumed is not None:
                    text = resumed.render(list(chunk.token_ids), chunk.finished)
                yield accounting.record(
                    list(chunk.token_ids), text, finish_reason, chunk.logprobs,
                    chunk.prompt_logprobs,
                )  # fmt: skip
                if chunk.finished:
                    return
        finally:
            await close(stream)

    async def _next_chunk(
        self, stream: AsyncIterator[TokenChunk], pending: asyncio.Future[TokenChunk] | None
    ) -> TokenChunk:
        """The stream's next chunk (``pending``: the first one, already asked for)."""
        try:
            async with asyncio.timeout(self._chunk_timeout_s):
                return await (anext(stream) if pending is None else pending)
        except StopAsyncIteration as e:
            raise UnavailableError("the decode stream ended before the request finished") from e
        except (PdserveError, TimeoutError):
            raise
        except Exception as e:  # a dead decode replica surfaces as any exception type
            logger.warning(
                "request %s: decode stream failed: %s: %s", self._request_id, type(e).__name__, e
            )
            raise UnavailableError(
                f"request {self._request_id}: the decode pool failed to serve it"
            ) from e
