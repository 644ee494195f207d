"""The prefill role: run a prompt, return its first token, export its KV under a lease.

:class:`PrefillWorker` adds a ``prefill_only`` request to its :class:`~engine.async_engine.
AsyncEngine`, waits for the first token, then stages the pinned blocks on the engine thread
(``AsyncEngine.stage_export``) and exports them through the :class:`~transfer.transport.
KVTransport`. The export's ``on_release`` (pull completed, importer released, lease expired,
shutdown) unpins the blocks on the engine thread. A first token that already ends the request
(EOS, a stop, ``max_tokens=1``) pins and exports nothing. Every failure or cancellation path
frees the blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncGenerator
from concurrent.futures import Future, ThreadPoolExecutor

from core.errors import TransferError, UnavailableError
from core.kv_handle import KVHandle
from core.messages import PrefillRequest, PrefillResult, PrefillStarted
from core.sampling import SamplingParams
from core.stats import ReplicaStats
from engine.async_engine import AsyncEngine
from engine.outputs import RequestOutput
from engine.request_stream import RequestStream
from prefill.result import prefill_result
from replica.kv_connector.pipelined_export import PipelinedExport
from replica.transfer_stats import transport_metrics, with_transfer_stats
from transfer import (
    FaultInjection,
    InMemoryTransferMetrics,
    KVTransport,
    TransferSide,
)
from transfer.leases import ReleaseCause

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
    ) -> None:
        """``metrics`` default to the transport's own ``metrics`` attribute when it has one."""
        self._engine = engine
        self._transport = transport
        self._metrics = transport_metrics(transport, metrics)
        self._lock = threading.Lock()
        self._pinned: set[str] = set()  # request ids whose export is live
        self._exporter = ThreadPoolExecutor(1, thread_name_prefix="pdserve-prefill-export")

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
        first = await self._first_token(
            request_id, request.prompt_token_ids, request.sampling, request.routing.cache_salt
        )
        if first.finish_reason is not None:
            logger.info(
                "request %s: first token ended it (%s); nothing exported",
                request_id,
                first.finish_reason,
            )
            return prefill_result(first, request.sampling, None)
        started_s = time.monotonic()
        handle, chunk_ends = await self._export(request_id)
        export_s = time.monotonic() - started_s
        logger.info(
            "request %s: prefilled %d tokens (%d cached); exported %d blocks as %s",
            request_id,
            len(request.prompt_token_ids),
            first.num_cached_tokens,
            handle.num_blocks,
            handle.transfer_id,
        )
        return prefill_result(first, request.sampling, handle, chunk_ends, export_s)

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
        export = PipelinedExport(
            self._transport, self._engine, request_id, num_blocks, self._export_freed
        )
        with self._lock:
            self._pinned.add(request_id)
        stream: RequestStream | None = None
        answered = False
        try:
            stream = await self._engine.open(
                request_id,
                request.prompt_token_ids,
                request.sampling,
                prefill_only=True,
                cache_salt=request.routing.cache_salt,
                watcher=export,
            )
            yield PrefillStarted(request_id, export.handle)
            first = await self._final_output(request_id, stream)
            handle = export.handle if export.done is not None else None
            if first.finish_reason is not None or handle is None:
                export.abandon()  # ended by its first token, or the export is gone
                handle = None
            chunk_ends = () if export.done is None else export.done.prompt_chunk_ends
            answered = True  # NOTE: from here the export is the decode's to pull and release
            yield prefill_result(first, request.sampling, handle, chunk_ends)
        except BaseException:
            if not answered:
                if stream is not None:
                    stream.close()  # aborts the prefill (its blocks free the export first)
                export.abandon()
            raise

    def _export_freed(self, request_id: str, cause: ReleaseCause) -> None:
        """Any thread: a pipelined export is over (its blocks are unpinned by the export)."""
        with self._lock:
            self._pinned.discard(request_id)
        logger.info("request %s: pipelined kv export freed (%s)", request_id, cause)

    async def _first_token(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None,
    ) -> RequestOutput:
        stream = await self._engine.open(
            request_id, prompt_token_ids, params, prefill_only=True, cache_salt=cache_salt
        )
        return await self._final_output(request_id, stream)

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

    async def _export(self, request_id: str) -> tuple[KVHandle, tuple[int, ...]]:
        """Stage the request's pinned blocks, then export them under a lease (off the event
        loop); a cancellation at any point frees whatever the export holds. Returns the handle
        and the prompt's recorded chunk ends."""
        staged = self._engine.stage_export(request_id)
        try:
            pinned = await asyncio.shield(asyncio.wrap_future(staged))
        except asyncio.CancelledError:
            staged.add_done_callback(lambda _: self._engine.release_soon(request_id))
            raise
        exported = self._exporter.submit(self._export_blocks, request_id, list(pinned.block_ids))
        try:
            return await asyncio.shield(asyncio.wrap_future(exported)), pinned.prompt_chunk_ends
        except asyncio.CancelledError:
            exported.add_done_callback(lambda f: self._undo_export(request_id, f))
            raise

    def _export_blocks(self, request_id: str, block_ids: list[int]) -> KVHandle:
        """Exporter thread: export the staged blocks or unpin them."""
        with self._lock:
            self._pinned.add(request_id)
        try:
            return self._transport.export(
                block_ids, on_release=lambda cause: self._on_release(request_id, cause)
            )
        except BaseException:
            with self._lock:
                self._pinned.discard(request_id)
            self._engine.release_soon(request_id)
            raise

    def _undo_export(self, request_id: str, future: Future[KVHandle]) -> None:
        """The caller went away mid-export: free whatever the export holds."""
        if future.cancelled() or future.exception() is not None:
            self._engine.release_soon(request_id)
            return
        handle = future.result()
        logger.info(
            "request %s: caller gone; releasing kv export %s", request_id, handle.transfer_id
        )
        self._exporter.submit(self._release_quietly, request_id, handle)

    def _release_quietly(self, request_id: str, handle: KVHandle) -> None:
        try:
            self._transport.release(handle)
        except TransferError as e:
            logger.warning(
                "request %s: release of %s failed: %s", request_id, handle.transfer_id, e
            )

    def _on_release(self, request_id: str, cause: ReleaseCause) -> None:
        """Any thread: the export is over; unpin on the engine thread."""
        with self._lock:
            self._pinned.discard(request_id)
        logger.info("request %s: kv export freed (%s)", request_id, cause)
        self._engine.release_soon(request_id)

    def set_faults(self, faults: FaultInjection) -> None:
        """Inject ``faults`` into every pull of this replica's exports from now on (load tests;
        ``FaultInjection()`` stops)."""
        self._transport.set_faults(faults)

    async def abort(self, request_id: str) -> bool:
        """Abort a prefill in progress; False when it is unknown or already done."""
        return await self._engine.abort(request_id)

    def stats(self) -> ReplicaStats:
        """KV blocks, queues, live exports and export-side transfer metrics."""
        with self._lock:
            num_exports = len(self._pinned)
        stats = dataclasses.replace(self._engine.kv_stats(), exports_pinned=num_exports)
        return with_transfer_stats(stats, self._metrics, TransferSide.EXPORT)

    async def drain(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until every export this replica holds was pulled,
        released or expired, so a replica being removed loses no decode's KV; returns how many
        exports are left (freed by :meth:`shutdown`). Serve has stopped routing new prompts."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            with self._lock:
                left = len(self._pinned)
            if left == 0 or time.monotonic() >= deadline_s:
                if left:
                    logger.warning("drain timed out with %d KV exports not pulled", left)
                return left
            await asyncio.sleep(_DRAIN_POLL_S)

    async def shutdown(self) -> None:
        """Free every export, stop the transport, then the engine."""
        await asyncio.to_thread(self._transport.close)
        await asyncio.to_thread(self._engine.shutdown)
        self._exporter.shutdown(wait=True)
