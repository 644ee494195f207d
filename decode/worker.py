"""The decode role: continue requests whose KV arrives from a prefill worker, stream tokens.

:meth:`DecodeWorker.generate` yields one :class:`~core.messages.TokenChunk` per engine step that
advanced the request. Without a handle it prefills locally and streams from the first token.
With one, a :class:`~replica.kv_connector.kv_import.KVImport` reserves blocks (retrying while
the pool is full, heartbeating the lease) and hands the import to the engine, whose attached
:class:`~replica.kv_connector.transport_connector.TransportKVConnector` pulls only the blocks the
local prefix cache lacks; the engine settles the pull's end and the request joins the batch. Its
chunks carry the tokens *after* ``first_token_id`` (the ingress already sent that one). A
pipelined handle comes before the prefill finished and without the first token: the pull takes
each block as the prefill completes it and the export tells the first token at the end. A
failed pull recomputes the prompt locally (``kv_failure_policy="recompute"``, identical output)
— never one refused across KV fingerprints (another model revision: the first token is another
version's), which always fails — or ends the stream with a chunk carrying its
:class:`~core.errors.ErrorReport` and the transfer's reason (``"fail"``, or any failed
pipelined pull: the ingress then continues the request elsewhere). Closing the iterator (client
gone) aborts the request; the engine cancels the pull and frees the blocks once it stopped
writing them, and the export on the other side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

from core.config import KVFailurePolicy
from core.errors import InvalidRequestError, PdserveError, TransferError
from core.kv_compat import KVCompat
from core.kv_handle import TransferFailure
from core.messages import DecodeRequest, PrefixExport, StageTimes, TokenChunk
from core.sampling import SamplingParams
from core.stats import ReplicaStats
from decode.token_chunks import aborted_chunk, error_chunk, token_chunk
from engine.async_engine import AsyncEngine
from engine.kv_connector.base import ImportEnded, ImportResult
from replica.kv_connector.kv_import import KVImport
from replica.kv_connector.transport_connector import TransportKVConnector
from replica.lora_adapters import ReplicaAdapters
from replica.prefix_export import PrefixExporter
from replica.transfer_stats import transport_metrics, with_transfer_stats
from transfer import InMemoryTransferMetrics, KVTransport, TransferSide

logger = logging.getLogger(__name__)


class DecodeWorker:
    """Decode engine plus the KV import side; one per decode replica."""

    def __init__(
        self,
        engine: AsyncEngine,
        transport: KVTransport,
        *,
        kv_failure_policy: KVFailurePolicy = "recompute",
        metrics: InMemoryTransferMetrics | None = None,
        kv_compat: KVCompat | None = None,
        reserve_timeout_s: float = 30.0,
        adapters: ReplicaAdapters | None = None,
    ) -> None:
        """Attaches a connector over ``transport`` to ``engine``; ``metrics`` default to the
        transport's ``metrics`` attribute when it has one; ``reserve_timeout_s`` bounds how long
        an import waits for free KV blocks; ``kv_compat``: the compatibility the transport was
        given, published in the stats (None: undeclared); ``adapters``: the LoRA adapters
        requests may name (default: none)."""
        self.kv_compat = kv_compat
        self.kv_failure_policy = kv_failure_policy
        self.adapters = adapters if adapters is not None else ReplicaAdapters()
        self._engine = engine
        self._transport = transport
        self._metrics = transport_metrics(transport, metrics)
        self._reserve_timeout_s = reserve_timeout_s
        self._lock = threading.Lock()
        self._imports: dict[str, KVImport] = {}
        self._streaming: set[str] = set()  # requests whose stream is open
        self._handoffs: dict[str, asyncio.Future[tuple[bool, PrefixExport | None]]] = {}
        self._num_handoffs = 0
        self._connector = TransportKVConnector(transport)
        engine.attach_connector(self._connector)

    @property
    def engine(self) -> AsyncEngine:
        """The engine this worker drives."""
        return self._engine

    @property
    def transport(self) -> KVTransport:
        """The KV transport this worker pulls through."""
        return self._transport

    async def generate(self, request: DecodeRequest) -> AsyncGenerator[TokenChunk, None]:
        """Stream the request's tokens, one chunk per engine step; see the module docstring."""
        request_id = request.request_id
        self._streaming.add(request_id)
        try:
            params = request.sampling
            handle = request.kv_handle
            pipelined = handle is not None and handle.pipelined
            if (handle is None) != (request.first_token_id is None) and not pipelined:
                raise InvalidRequestError(
                    f"request {request_id}: first_token_id and kv_handle go together "
                    "(only a pipelined handle comes without the first token)",
                    param="kv_handle",
                )
            if request.kv_handle is None:
                chunks = self._generate_local(request, params)
            else:
                chunks = self._generate_imported(request, params)
            async with aclosing(chunks):  # a closed stream closes the inner one at once
                async for chunk in chunks:
                    yield await self._with_handoff(chunk) if chunk.finished else chunk
        except PdserveError as e:
            logger.warning("request %s failed: %s: %s", request_id, e.error_type, e.message)
            yield error_chunk(request, e)
        finally:
            self._streaming.discard(request_id)
            self._handoffs.pop(request_id, None)  # a stream closed while handed off

    async def hand_off(self, exporter: PrefixExporter) -> int:
        """This replica is leaving: stop every request decoding here and end its stream with
        an aborted chunk carrying its computed blocks' export (``TokenChunk.handoff``), so the
        ingress continues it on another replica, which pulls them instead of recomputing
        them. Requests still queued or importing stay. Returns how many were handed off."""
        num_handed_off = 0
        for request_id in sorted(self._streaming - self._handoffs.keys()):
            pending: asyncio.Future[tuple[bool, PrefixExport | None]]
            pending = asyncio.get_running_loop().create_future()
            self._handoffs[request_id] = pending  # its stream's abort waits for the export
            try:
                result = await exporter.hand_off(request_id)
            except Exception as e:  # the engine stopped: whatever ended the stream, recompute
                logger.warning("request %s: handoff failed: %s", request_id, e)
                result = (True, None)
            pending.set_result(result)
            if not result[0] and self._handoffs.get(request_id) is pending:
                del self._handoffs[request_id]  # not decoding yet: it stays here
            num_handed_off += result[0]
            self._num_handoffs += result[0]
            if result[0]:
                logger.info(
                    "request %s: handed off (%s)",
                    request_id,
                    "no blocks" if result[1] is None else f"{result[1].handle.num_blocks} blocks",
                )
        return num_handed_off

    async def _with_handoff(self, chunk: TokenChunk) -> TokenChunk:
        """A stream's last chunk, with the export of its handoff when one stopped it."""
        pending = self._handoffs.pop(chunk.request_id, None)
        if pending is None:
            return chunk
        stopped, export = await pending
        if not stopped or chunk.finish_reason != "abort":
            return chunk
        return dataclasses.replace(chunk, handoff=export)

    async def _generate_local(
        self, request: DecodeRequest, params: SamplingParams
    ) -> AsyncGenerator[TokenChunk, None]:
        prompt = request.prompt_token_ids
        stream = await self._engine.open(
            request.request_id,
            prompt,
            params,
            cache_salt=request.routing.cache_salt,
            lora_request=self.adapters.resolve(request.routing.lora_name),
        )
        logger.debug("request %s: local prefill of %d tokens", request.request_id, len(prompt))
        try:
            async for output in stream:
                yield token_chunk(output, params, len(prompt), output.num_cached_tokens, local=True)
        finally:
            stream.close()

    async def _generate_imported(
        self, request: DecodeRequest, params: SamplingParams
    ) -> AsyncGenerator[TokenChunk, None]:
        request_id, handle = request.request_id, request.kv_handle
        assert handle is not None
        started_s = time.monotonic()
        with self._lock:
            if request_id in self._imports:  # NOTE: before naming the source: it may be shared
                raise InvalidRequestError(f"request {request_id} is already importing")
            kv = KVImport(
                self._engine,
                self._connector,
                request_id,
                handle,
                reserve_timeout_s=self._reserve_timeout_s,
            )
            self._imports[request_id] = kv
        knows_first = request.first_token_id is not None
        try:
            opened = await kv.reserve(
                request.prompt_token_ids,
                params,
                request.first_token_id,
                request.prompt_chunk_ends,
                cache_salt=request.routing.cache_salt,
                lora_request=self.adapters.resolve(request.routing.lora_name),
                recompute_on_failure=self.kv_failure_policy == "recompute",
            )
            ended = await kv.wait()
            if ended is None:  # aborted during the pull
                yield aborted_chunk(request)
                return
            num_cached = self._settled(kv, ended, len(request.prompt_token_ids), knows_first)
            ready_s: float | None = time.monotonic()
            async for output in opened.stream:
                cached = output.num_cached_tokens if num_cached is None else num_cached
                times = None
                if output.new_token_ids and ready_s is not None:
                    times = StageTimes(transfer_s=ready_s - started_s,
                                       first_decode_s=time.monotonic() - ready_s)  # fmt: skip
                    ready_s = None
                yield token_chunk(output, params, len(request.prompt_token_ids), cached,
                                  stage_times=times)  # fmt: skip
        except PdserveError:
            if not kv.aborted:
                raise
            yield aborted_chunk(request)
        finally:
            with self._lock:
                self._imports.pop(request_id, None)
            kv.close()

    def _settled(
        self, kv: KVImport, ended: ImportEnded, num_prompt_tokens: int, knows_first: bool
    ) -> int | None:
        """What the engine made of the import's end: the prompt tokens not computed here
        (None: ask the engine, after a recompute); raises :class:`TransferError` when the
        request failed (the ingress continues it elsewhere)."""
        request_id = kv.request_id
        if ended.result is ImportResult.READY:
            assert kv.opened is not None
            logger.info(
                "request %s: pulled %d of %d blocks; decoding",
                request_id,
                len(kv.opened.allocation.missing_block_indices),
                kv.handle.num_blocks,
            )
            return num_prompt_tokens
        # NOTE: without its first token a recompute would sample (and stream) a token the client
        # already has: the request fails here and the ingress continues it elsewhere (migration)
        reason = ended.failure or TransferFailure.INTERNAL
        # NOTE: across fingerprints the first token is another version's: recomputing after it
        # would mix versions in one output; the ingress continues the request elsewhere
        recompute = (
            self.kv_failure_policy == "recompute"
            and knows_first
            and reason is not TransferFailure.KV_INCOMPATIBLE
        )
        logger.warning(
            "request %s: kv transfer %s failed (%s: %s); %s",
            request_id,
            kv.handle.transfer_id,
            reason,
            ended.message,
            "recomputing locally" if recompute else "failing the request",
        )
        if recompute:
            return None
        raise TransferError(
            f"request {request_id}: KV transfer failed ({reason}): {ended.message}",
            reason=reason,
        )

    async def abort(self, request_id: str) -> bool:
        """Abort a request (cancelling its pull first); False when it is unknown or done."""
        with self._lock:
            kv = self._imports.get(request_id)
        if kv is not None and kv.abort_reservation():
            logger.info("request %s: aborting during its KV reservation", request_id)
            return True
        return await self._engine.abort(request_id)  # a running pull stops before its blocks go

    def stats(self) -> ReplicaStats:
        """KV blocks, queues and import-side transfer metrics."""
        with self._lock:
            num_imports = len(self._imports)
        stats = dataclasses.replace(
            self._engine.kv_stats(),
            imports_in_progress=num_imports,
            handoffs_total=self._num_handoffs,
            kv_fingerprint="" if self.kv_compat is None else self.kv_compat.fingerprint(),
        )
        return with_transfer_stats(stats, self._metrics, TransferSide.IMPORT)

    async def drain(self, timeout_s: float) -> int:
        """Nothing to wait for: Serve lets the streams in flight finish within the pool's
        graceful shutdown timeout, and the ingress migrates any it cuts off. Returns 0."""
        return 0

    async def shutdown(self) -> None:
        """Cancel pulls, stop the transport, then the engine (which frees the blocks the
        cancelled pulls stopped writing)."""
        await asyncio.to_thread(self._transport.close)
        await asyncio.to_thread(self._engine.shutdown)
        self._connector.close()
