"""One request's KV import on a decode worker: reserve blocks, pull the missing ones, hand off.

:class:`KVImport` owns the unhappy paths of a handoff so the worker reads as a few steps. It
reserves the request's blocks on the engine thread (retrying while the pool is full, heartbeating
the exporter's lease meanwhile), pulls only the blocks the local prefix cache lacks — off the
engine thread, so the engine keeps stepping other requests — and waits for the pull without
blocking the event loop. :meth:`KVImport.close` makes every exit safe: a running pull is
cancelled and the request's blocks are freed only once nothing writes into them any more; an
export that was never pulled is released so the prefill side frees it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import Executor

from core.errors import KVCacheError, LayoutMismatchError, TransferError, UnavailableError
from core.kv_handle import KVHandle, TransferState, TransferStatus
from core.sampling import SamplingParams
from engine.async_engine import AsyncEngine
from engine.request_stream import RequestStream
from engine.scheduler.output import ImportAllocation
from transfer import KVTransport, TransferTask

logger = logging.getLogger(__name__)

_RESERVE_BACKOFF_S = (0.01, 0.2)  # first and longest pause between reservation attempts


class KVImport:
    """The KV handoff of one request into this decode worker."""

    def __init__(
        self,
        engine: AsyncEngine,
        transport: KVTransport,
        request_id: str,
        handle: KVHandle,
        *,
        releaser: Executor,
        reserve_timeout_s: float,
    ) -> None:
        self.request_id = request_id
        self.handle = handle
        self.allocation: ImportAllocation | None = None
        self.stream: RequestStream | None = None
        self.task: TransferTask | None = None
        self._engine = engine
        self._transport = transport
        self._releaser = releaser
        self._reserve_timeout_s = reserve_timeout_s
        self._deadline_ms = handle.lease_deadline_unix_ms
        self._lock = threading.Lock()
        self._aborted = False
        self._handed_off = False

    @property
    def aborted(self) -> bool:
        """True once :meth:`abort` took effect."""
        return self._aborted

    @property
    def num_pulled_blocks(self) -> int:
        """Blocks this import pulls (those the local prefix cache lacks)."""
        return 0 if self.task is None else len(self.task.dst_block_ids)

    async def reserve(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        first_token_id: int | None,
        prompt_chunk_ends: tuple[int, ...] = (),
        cache_salt: str | None = None,
    ) -> None:
        """Check the layout, then reserve blocks (reusing local prefix hits of the same
        ``cache_salt``) on the engine; ``first_token_id`` None for a pipelined handle (the
        export tells it)."""
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
                self.allocation, self.stream = await self._engine.open_import(
                    self.request_id,
                    prompt_token_ids,
                    params,
                    first_token_id,
                    prompt_chunk_ends,
                    cache_salt=cache_salt,
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
        if len(self.allocation.block_ids) != self.handle.num_blocks:
            raise LayoutMismatchError(
                f"request {self.request_id}: the export holds {self.handle.num_blocks} blocks, "
                f"the prompt needs {len(self.allocation.block_ids)} here"
            )

    async def pull(self) -> TransferStatus:
        """Pull the missing blocks and wait for the outcome (heartbeating while queued)."""
        assert self.allocation is not None, "reserve() first"
        missing = self.allocation.missing_block_indices
        with self._lock:
            self._raise_if_aborted()
            self.task = self._transport.pull(
                self.handle, [self.allocation.block_ids[i] for i in missing], missing
            )
        logger.debug(
            "request %s: pulling %d of %d blocks of %s",
            self.request_id,
            len(missing),
            self.handle.num_blocks,
            self.handle.transfer_id,
        )
        return await self._wait(self.task)

    async def _wait(self, task: TransferTask) -> TransferStatus:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def on_done(_: TransferTask) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone; close() cleans up
                loop.call_soon_threadsafe(_resolve, done)

        task.add_done_callback(on_done)
        while not done.done():
            await asyncio.wait({done}, timeout=self._heartbeat_interval_s())
            if not done.done() and task.state is TransferState.PENDING:
                await self._heartbeat()
        return task.status()

    def _heartbeat_interval_s(self) -> float:
        remaining_s = self._deadline_ms / 1000 - time.time()
        return min(max(remaining_s / 3, 0.05), 10.0)

    def _heartbeat_due(self) -> bool:
        return self._deadline_ms / 1000 - time.time() < 2 * self._heartbeat_interval_s()

    async def _heartbeat(self) -> None:
        try:
            self._deadline_ms = await asyncio.to_thread(self._transport.heartbeat, self.handle)
        except TransferError as e:  # the pull itself will fail with the precise reason
            logger.warning("request %s: lease heartbeat failed: %s", self.request_id, e)

    def hand_off(self) -> bool:
        """The pull ended: from now on aborts go to the engine. False if aborted meanwhile."""
        with self._lock:
            self._handed_off = True
            return not self._aborted

    def abort(self) -> bool:
        """Abort before the hand-off (cancels the pull); False once handed off."""
        with self._lock:
            if self._handed_off:
                return False
            self._aborted = True
            task = self.task
        if task is not None:
            task.cancel()
        return True

    def _raise_if_aborted(self) -> None:
        if self._aborted:
            raise UnavailableError(f"request {self.request_id} aborted during its KV import")

    def close(self) -> None:
        """Free whatever this import still holds, on every exit path (never blocks)."""
        task, stream = self.task, self.stream
        if task is not None and not task.done():
            task.cancel()
            # NOTE: the destination blocks are freed only once the pull stopped writing them.
            if stream is not None:
                task.add_done_callback(lambda _: stream.close())
            return
        if stream is not None:
            stream.close()
        if task is None:  # never pulled: the exporter still pins the blocks
            try:
                self._releaser.submit(self._release_export)
            except RuntimeError:  # the worker is shutting down; the lease bounds the export
                logger.warning("request %s: could not release its kv export", self.request_id)

    def _release_export(self) -> None:
        try:
            self._transport.release(self.handle)
            logger.info(
                "request %s: released unpulled %s", self.request_id, self.handle.transfer_id
            )
        except TransferError as e:
            logger.info(
                "request %s: release of %s: %s", self.request_id, self.handle.transfer_id, e
            )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
