"""One request's KV import on a decode worker, the worker's half: reserve, then wait for the end.

:class:`KVImport` reserves the request's blocks through
:meth:`~engine.async_engine.AsyncEngine.import_through` (retrying while the pool is full,
heartbeating the exporter's lease meanwhile), which hands the missing blocks to the worker's
:class:`~replica.kv_connector.transport_connector.TransportKVConnector` on the engine thread;
the engine starts the pull and settles its end. :meth:`KVImport.wait` waits for that end without
blocking the event loop (heartbeating while the pull has not begun). :meth:`KVImport.close`
makes every exit safe: an export never handed to the engine is released, an import that was is
aborted on the engine (a running pull is cancelled there and its blocks are freed only once it
stopped writing them).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from core.errors import KVCacheError, LayoutMismatchError, TransferError, UnavailableError
from core.kv_handle import KVHandle
from core.sampling import SamplingParams
from engine.async_engine import AsyncEngine, ConnectedImport
from engine.kv_connector.base import ImportEnded
from engine.lora import LoRARequest
from replica.kv_connector.transport_connector import TransportKVConnector

logger = logging.getLogger(__name__)

_RESERVE_BACKOFF_S = (0.01, 0.2)  # first and longest pause between reservation attempts


class KVImport:
    """The KV handoff of one request into this decode worker."""

    def __init__(
        self,
        engine: AsyncEngine,
        connector: TransportKVConnector,
        request_id: str,
        handle: KVHandle,
        *,
        reserve_timeout_s: float,
    ) -> None:
        self.request_id = request_id
        self.handle = handle
        self.opened: ConnectedImport | None = None
        """The import once handed to the engine (blocks reserved, pull queued)."""
        self._engine = engine
        self._connector = connector
        self._source = connector.add_source(handle)
        self._reserve_timeout_s = reserve_timeout_s
        self._deadline_ms = handle.lease_deadline_unix_ms
        self._lease_s = max(self._deadline_ms / 1000 - time.time(), 0.0)  # as the handle came
        self._lock = threading.Lock()
        self._aborted = False

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort_reservation` took effect."""
        return self._aborted

    async def reserve(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        first_token_id: int | None,
        prompt_chunk_ends: tuple[int, ...] = (),
        *,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
        recompute_on_failure: bool = True,
    ) -> ConnectedImport:
        """Check the layout, then reserve blocks (reusing local prefix hits of the same
        ``cache_salt``) and hand the import to the engine; ``first_token_id`` None for a
        pipelined handle (the export tells it)."""
        mine = self._engine.layout.unsplit()  # gangs of any sizes exchange KV head by head
        if self.handle.layout_fingerprint != mine.fingerprint():
            raise LayoutMismatchError(
                f"request {self.request_id}: exporter KV layout {self.handle.layout_fingerprint} "
                f"!= this decode worker's {mine.fingerprint()} ({mine}); refusing the pull"
            )
        pause_s, deadline_s = _RESERVE_BACKOFF_S[0], time.monotonic() + self._reserve_timeout_s
        while True:
            self._raise_if_aborted()
            try:
                opened = await self._engine.import_through(
                    self._connector,
                    self._source,
                    self.request_id,
                    prompt_token_ids,
                    params,
                    first_token_id,
                    prompt_chunk_ends,
                    cache_salt=cache_salt,
                    lora_request=lora_request,
                    recompute_on_failure=recompute_on_failure,
                )
                break
            except KVCacheError:
                if time.monotonic() + pause_s > deadline_s:
                    raise
            logger.debug("request %s: KV pool full; retrying the reservation", self.request_id)
            if self._heartbeat_due():
                await self._heartbeat()
            await asyncio.sleep(pause_s)
            pause_s = min(2 * pause_s, _RESERVE_BACKOFF_S[1])
        with self._lock:
            self.opened = opened
        self._raise_if_aborted()  # aborted while the reservation ran: close() aborts it
        return opened

    async def wait(self) -> ImportEnded | None:
        """How the import ended once the engine settled it (None: aborted meanwhile),
        heartbeating the lease while the pull has not begun."""
        assert self.opened is not None, "reserve() first"
        ended = asyncio.wrap_future(self.opened.ended)
        while not ended.done():
            await asyncio.wait({ended}, timeout=self._heartbeat_interval_s())
            if not ended.done() and self._connector.pull_pending(self.request_id):
                await self._heartbeat()
        return ended.result()

    def _heartbeat_interval_s(self) -> float:
        remaining_s = self._deadline_ms / 1000 - time.time()
        return min(max(remaining_s / 3, 0.05), 10.0)

    def _heartbeat_due(self) -> bool:
        """Between reservation attempts: once half the lease the handle came with is gone."""
        return self._deadline_ms / 1000 - time.time() < max(self._lease_s / 2,
                                                            2 * _RESERVE_BACKOFF_S[1])  # fmt: skip

    async def _heartbeat(self) -> None:
        try:
            self._deadline_ms = await asyncio.to_thread(self._connector.transport.heartbeat,
                                                        self.handle)  # fmt: skip
        except TransferError as e:  # the pull itself will fail with the precise reason
            logger.warning("request %s: lease heartbeat failed: %s", self.request_id, e)

    def abort_reservation(self) -> bool:
        """Abort before the import reached the engine; False once it did (abort it there)."""
        with self._lock:
            if self.opened is not None:
                return False
            self._aborted = True
            return True

    def _raise_if_aborted(self) -> None:
        if self._aborted:
            raise UnavailableError(f"request {self.request_id} aborted during its KV import")

    def close(self) -> None:
        """Free whatever this import still holds, on every exit path (never blocks)."""
        if self.opened is None:  # never reached the engine: the exporter still pins the blocks
            self._connector.discard_source(self._source)
        else:
            self.opened.stream.close()  # aborts it unless finished; a pull stops first
