"""The prefill role: run a prompt, return its first token, export its KV under a lease.

:class:`PrefillWorker` adds a ``prefill_only`` request to its :class:`~engine.async_engine.
AsyncEngine` with its :class:`~replica.kv_connector.transport_connector.TransportKVConnector`
attached: the engine hands the prompt's blocks to the connector's export as they complete
(staged where the transfer layer reads them). The pipelined :meth:`PrefillWorker.prefill_stream`
opens the export before the prompt runs and answers its handle at once; :meth:`PrefillWorker.
prefill` exports in one piece when the prefill finishes (its lease starts then). The export's
release (pull completed, importer released, lease expired, shutdown) unpins the blocks on the
engine thread. A first token that already ends the request (EOS, a stop, ``max_tokens=1``) pins
and exports nothing. Every failure or cancellation path frees the export and the blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator

from core.errors import TransferError, UnavailableError
from core.kv_compat import KVCompat
from core.kv_handle import TransferFailure
from core.messages import PrefillRequest, PrefillResult, PrefillStarted
from core.stats import ReplicaStats
from engine.async_engine import AsyncEngine
from engine.outputs import RequestOutput
from engine.request_stream import RequestStream
from prefill.result import prefill_result
from replica.kv_connector.transport_connector import FinishedExport, TransportKVConnector
from replica.lora_adapters import ReplicaAdapters
from replica.transfer_stats import transport_metrics, with_transfer_stats
from transfer import (
    FaultInjection,
    InMemoryTransferMetrics,
    KVTransport,
    TransferSide,
)

logger = logging.getLogger(__name__)

_DRAIN_POLL_S = 0.05
"""How often a draining replica checks its exports (a bounded wait, not a request path)."""


class PrefillWorker:
    """Prefill-only engine plus the KV export side; one per prefill replica."""

    def __init__(
        self,
        engine: AsyncEngine,
        transport: KVTransport,
        *,
        metrics: InMemoryTransferMetrics | None = None,
        kv_compat: KVCompat | None = None,
        adapters: ReplicaAdapters | None = None,
    ) -> None:
        """Attaches a connector over ``transport`` to ``engine``; ``metrics`` default to the
        transport's own ``metrics`` attribute when it has one; ``kv_compat``: the compatibility
        the transport was given, published in the stats (None: undeclared); ``adapters``: the
        LoRA adapters requests may name (default: none)."""
        self.kv_compat = kv_compat
        self._engine = engine
        self.adapters = adapters if adapters is not None else ReplicaAdapters()
        self._transport = transport
        self._metrics = transport_metrics(transport, metrics)
        self._connector = TransportKVConnector(transport)
        engine.attach_connector(self._connector)

    @property
    def engine(self) -> AsyncEngine:
        """The engine this worker drives."""
        return self._engine

    @property
    def transport(self) -> KVTransport:
        """The KV transport this worker exports through."""
        return self._transport

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Compute the prompt, sample the first token, export the KV.

        Raises ``core.errors`` types: ``InvalidRequestError`` (bad prompt or sampling),
        ``UnavailableError`` (aborted or shut down), ``TransferError`` (export refused).
        """
        request_id = request.request_id
        self._connector.export_when_finished(request_id)
        answered = False
        try:
            stream = await self._open(request)
            first = await self._final_output(request_id, stream)
            started_s = time.monotonic()
            finished = self._finished_export(request_id, first)
            if isinstance(finished, TransferError):
                raise finished
            answered = True
        finally:
            if not answered:
                self._connector.abandon_export(request_id)
        if finished is None:
            logger.info(
                "request %s: first token ended it (%s); nothing exported",
                request_id,
                first.finish_reason,
            )
            return prefill_result(first, request.sampling, None)
        logger.info(
            "request %s: prefilled %d tokens (%d cached); exported %d blocks as %s",
            request_id,
            len(request.prompt_token_ids),
            first.num_cached_tokens,
            finished.handle.num_blocks,
            finished.handle.transfer_id,
        )
        return prefill_result(
            first,
            request.sampling,
            finished.handle,
            finished.done.prompt_chunk_ends,
            time.monotonic() - started_s,
        )

    async def prefill_stream(
        self, request: PrefillRequest
    ) -> AsyncGenerator[PrefillStarted | PrefillResult, None]:
        """The pipelined prefill: a :class:`PrefillStarted` with an export the decode can pull
        from at once (its blocks are added as the prompt's chunks complete), then the
        :class:`PrefillResult` once the first token is sampled (the export then holds every
        block and knows the first token). Raises as :meth:`prefill`; every way out (an error,
        the caller going away) frees the export and the blocks."""
        request_id = request.request_id
        block_size = self._engine.layout.block_size
        num_blocks = -(-len(request.prompt_token_ids) // block_size)
        handle = self._connector.open_export(request_id, num_blocks)
        stream: RequestStream | None = None
        answered = False
        try:
            stream = await self._open(request)
            yield PrefillStarted(request_id, handle)
            first = await self._final_output(request_id, stream)
            finished = self._finished_export(request_id, first)
            answered = True  # NOTE: from here the export is the decode's to pull and release
            if isinstance(finished, FinishedExport):
                yield prefill_result(
                    first, request.sampling, handle, finished.done.prompt_chunk_ends
                )
            else:  # ended by its first token, or the export is gone
                yield prefill_result(first, request.sampling, None)
        finally:
            if not answered:
                if stream is not None:
                    stream.close()  # aborts the prefill (its blocks free the export first)
                self._connector.abandon_export(request_id)

    async def _open(self, request: PrefillRequest) -> RequestStream:
        return await self._engine.open(
            request.request_id,
            request.prompt_token_ids,
            request.sampling,
            prefill_only=True,
            cache_salt=request.routing.cache_salt,
            export_to=self._connector,
            lora_request=self.adapters.resolve(request.routing.lora_name),
        )

    def _finished_export(
        self, request_id: str, first: RequestOutput
    ) -> FinishedExport | TransferError | None:
        """The request's finished export, or None (freed) when its first token ended it or
        the export ended first; a one-shot export's refusal."""
        finished = self._connector.take_finished_export(request_id)
        if isinstance(finished, FinishedExport) and first.finish_reason is None:
            return finished
        self._connector.abandon_export(request_id)
        if first.finish_reason is not None:
            return None
        logger.info("request %s: its kv export ended before its prefill", request_id)
        return finished if finished is not None else _export_lost(request_id)

    @staticmethod
    async def _final_output(request_id: str, stream: RequestStream) -> RequestOutput:
        """The finished output of a prefill-only request (its first token); closing early
        aborts it."""
        final: RequestOutput | None = None
        try:
            async for output in stream:
                if output.finished:
                    final = output
                    break
        finally:
            stream.close()
        if final is None or not final.token_ids:
            reason = "aborted" if final is None else final.finish_reason
            raise UnavailableError(
                f"request {request_id}: prefill ended without a token ({reason})"
            )
        return final

    def set_faults(self, faults: FaultInjection) -> None:
        """Inject ``faults`` into every pull of this replica's exports from now on (load tests;
        ``FaultInjection()`` stops)."""
        self._transport.set_faults(faults)

    async def abort(self, request_id: str) -> bool:
        """Abort a prefill in progress; False when it is unknown or already done."""
        return await self._engine.abort(request_id)

    def stats(self) -> ReplicaStats:
        """KV blocks, queues, live exports and export-side transfer metrics."""
        stats = dataclasses.replace(
            self._engine.kv_stats(),
            exports_pinned=self._connector.num_exports,
            kv_fingerprint="" if self.kv_compat is None else self.kv_compat.fingerprint(),
        )
        return with_transfer_stats(stats, self._metrics, TransferSide.EXPORT)

    async def drain(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until every export this replica holds was pulled,
        released or expired, so a replica being removed loses no decode's KV; returns how many
        exports are left (freed by :meth:`shutdown`). Serve has stopped routing new prompts."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            left = self._connector.num_exports
            if left == 0 or time.monotonic() >= deadline_s:
                if left:
                    logger.warning("drain timed out with %d KV exports not pulled", left)
                return left
            await asyncio.sleep(_DRAIN_POLL_S)

    async def shutdown(self) -> None:
        """Free every export, stop the transport, then the engine."""
        await asyncio.to_thread(self._transport.close)
        await asyncio.to_thread(self._engine.shutdown)
        self._connector.close()


def _export_lost(request_id: str) -> TransferError:
    return TransferError(
        f"request {request_id}: its KV export ended before its prefill finished",
        reason=TransferFailure.EXPORTER_UNAVAILABLE,
    )
