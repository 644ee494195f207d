"""The :class:`~engine.kv_connector.base.KVConnector` over the transfer layer (gRPC or
same-node pulls; the in-process transport in tests).

An export is a leased, pipelined handle (:meth:`TransportKVConnector.open_export`, opened
before the prompt runs so the handle can travel ahead of the KV): the scheduler side grows it
as blocks complete and finishes it with the first token; the transport's release (pulled,
released by the importer, expired) reports it freed so the engine unpins. An import is a pull
from a handle (:meth:`TransportKVConnector.add_source`) into the reserved blocks, started by the
worker side off the engine thread; its end is reported with the first token the export carried.
Transport callbacks arrive on other threads, so every table here is guarded by one lock.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass

from core.errors import TransferError
from core.kv_handle import ExportDone, KVHandle, TransferState
from engine.kv_connector.base import (
    ImportEnded,
    ImportResult,
    KVConnectorFinished,
    KVImportSource,
)
from engine.scheduler.output import ImportAllocation, PinnedBlocks
from transfer import KVTransport, TransferTask
from transfer.leases import ReleaseCause

logger = logging.getLogger(__name__)

_CANCEL_WAIT_S = 5.0  # how long freeing an import's blocks waits for its pull to stop


@dataclass
class _Export:
    handle: KVHandle
    num_added: int = 0


@dataclass(frozen=True)
class _Pull:
    handle: KVHandle
    dst_block_ids: list[int]
    wanted_indices: list[int]


class TransportKVConnector:
    """One engine's exports and imports through ``transport``."""

    def __init__(self, transport: KVTransport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._exports: dict[str, _Export] = {}  # by exporting request id
        self._sources: dict[str, KVHandle] = {}  # by transfer id
        self._queued: dict[str, _Pull] = {}  # by importing request id
        self._tasks: dict[str, TransferTask] = {}
        self._ended_imports: list[ImportEnded] = []
        self._freed_exports: list[str] = []

    # -- the role worker's side: handles -----------------------------------------------------------

    def open_export(self, request_id: str, num_blocks: int) -> KVHandle:
        """Open the export of a prefill about to run; its handle may be pulled from at once."""
        handle = self._transport.open_export(
            num_blocks, on_release=lambda cause: self._export_released(request_id, cause)
        )
        with self._lock:
            self._exports[request_id] = _Export(handle)
        return handle

    def add_source(self, handle: KVHandle) -> KVImportSource:
        """Remember an exporter's handle; the source an import names to pull from it."""
        with self._lock:
            self._sources[handle.transfer_id] = handle
        return KVImportSource(handle.transfer_id)

    # -- scheduler side ---------------------------------------------------------------------------

    def export_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Add these computed blocks to the request's export."""
        with self._lock:
            export = self._exports.get(request_id)
        if export is None:
            return  # freed meanwhile
        try:
            self._transport.add_ready(export.handle, block_ids)
            export.num_added += len(block_ids)
        except TransferError as e:  # the importer released it or it expired
            logger.info("request %s: export no longer grows: %s", request_id, e)

    def export_finished(self, pinned: PinnedBlocks) -> None:
        """Finish the export with the rest of the pinned blocks and the first token."""
        with self._lock:
            export = self._exports.get(pinned.request_id)
        if export is None:
            self._report_freed(pinned.request_id)  # freed before its prefill ended: unpin
            return
        done = ExportDone(pinned.first_token_id, pinned.prompt_chunk_ends)
        try:
            self._transport.finish_export(export.handle, pinned.block_ids[export.num_added :], done)
        except TransferError as e:
            logger.info("request %s: export ended before its prefill: %s", pinned.request_id, e)
            self._report_freed(pinned.request_id)

    def import_blocks(self, allocation: ImportAllocation, source: KVImportSource) -> None:
        """Queue the pull of the allocation's missing blocks from ``source``'s handle."""
        missing = allocation.missing_block_indices
        with self._lock:
            handle = self._sources.pop(source.export_id)
            self._queued[allocation.request_id] = _Pull(
                handle, [allocation.block_ids[i] for i in missing], missing
            )

    def before_free(self, request_id: str) -> None:
        """Stop the request's pull before its blocks go, or release its export."""
        with self._lock:
            queued = self._queued.pop(request_id, None)
            task = self._tasks.pop(request_id, None)
            export = self._exports.pop(request_id, None)
        if queued is not None:
            self._release(queued.handle)
        if task is not None and not task.done():
            task.cancel()
            # NOTE: a freed block may be reused at once: the pull must stop writing it first
            task.wait(_CANCEL_WAIT_S)
        if export is not None:
            self._release(export.handle)

    # -- worker side ------------------------------------------------------------------------------

    def start_transfers(self) -> None:
        """Start the queued pulls (they run on the transport's threads)."""
        with self._lock:
            queued, self._queued = self._queued, {}
        for request_id, pull in queued.items():
            task = self._transport.pull(pull.handle, pull.dst_block_ids, pull.wanted_indices)
            with self._lock:
                self._tasks[request_id] = task
            task.add_done_callback(functools.partial(self._pull_ended, request_id))

    def wait(self, timeout_s: float) -> bool:
        """Block until a pull ended or an export was freed, at most ``timeout_s``."""
        with self._ended:
            return self._ended.wait_for(
                lambda: bool(self._ended_imports or self._freed_exports), timeout_s
            )

    def take_finished(self) -> KVConnectorFinished:
        """The pulls that ended and the exports freed since the last call."""
        with self._lock:
            finished = KVConnectorFinished(tuple(self._ended_imports), tuple(self._freed_exports))
            self._ended_imports.clear()
            self._freed_exports.clear()
        return finished

    # -- transport callbacks (any thread) -----------------------------------------------------

    def _pull_ended(self, request_id: str, task: TransferTask) -> None:
        with self._ended:
            if self._tasks.pop(request_id, None) is None:
                return  # freed meanwhile: nobody waits for it
            done = task.export_done
            if task.state is TransferState.DONE:
                ended = ImportEnded(
                    request_id,
                    ImportResult.READY,
                    None if done is None else done.first_token_id,
                    () if done is None else done.prompt_chunk_ends,
                )
            else:
                ended = ImportEnded(request_id, ImportResult.FAILED)
            self._ended_imports.append(ended)
            self._ended.notify_all()

    def _export_released(self, request_id: str, cause: ReleaseCause) -> None:
        logger.debug("request %s: export released (%s)", request_id, cause)
        with self._lock:
            self._exports.pop(request_id, None)
        self._report_freed(request_id)

    def _report_freed(self, request_id: str) -> None:
        with self._ended:
            self._freed_exports.append(request_id)
            self._ended.notify_all()

    def _release(self, handle: KVHandle) -> None:
        try:
            self._transport.release(handle)
        except TransferError as e:
            logger.debug("releasing %s: %s", handle.transfer_id, e)
