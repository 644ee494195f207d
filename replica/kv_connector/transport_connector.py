"""The :class:`~engine.kv_connector.base.KVConnector` over the transfer layer (gRPC or
same-node pulls; the in-process transport in tests): where a role worker's KV leaves and
arrives.

An export is a leased handle: pipelined (:meth:`TransportKVConnector.open_export`, opened
before the prompt runs so the handle can travel ahead of the KV; the scheduler side grows it as
blocks complete and finishes it with the first token) or one-shot
(:meth:`TransportKVConnector.export_when_finished`: the handle is made when the prefill
finishes, so its lease starts then). The worker takes the finished export
(:meth:`TransportKVConnector.take_finished_export`); the transport's release (pulled, released
by the importer, expired) reports it freed so the engine unpins. An import is a pull
from a handle (:meth:`TransportKVConnector.add_source`) into the reserved blocks, started by the
worker side off the engine thread; its end is reported with the first token the export carried,
the blocks it wrote into the host mirror (to upload) and, on failure, the transfer's reason.
A request freed while its pull runs has the pull cancelled and its blocks held (never waited
for on the engine thread) until the pull stopped writing them. Releasing an unpulled export of
another process is a round trip: it runs on the connector's own thread. Transport callbacks
arrive on other threads, so every table here is guarded by one lock.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from core.errors import LayoutMismatchError, TransferError
from core.kv_handle import ExportDone, KVHandle, TransferFailure, TransferState
from engine.kv.kv_cache_manager import BlockRelease
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

_REASONS = frozenset(failure.value for failure in TransferFailure)


@dataclass(frozen=True)
class FinishedExport:
    """An export whose prefill finished: its handle (every block ready) and the first token."""

    handle: KVHandle
    done: ExportDone


@dataclass
class _Export:
    handle: KVHandle | None  # None: a one-shot export, made when the prefill finishes
    num_added: int = 0


@dataclass(frozen=True)
class _Pull:
    handle: KVHandle
    dst_block_ids: list[int]
    wanted_indices: list[int]


def _nothing() -> None:
    """No one to wake."""


class TransportKVConnector:
    """One engine's exports and imports through ``transport``."""

    def __init__(self, transport: KVTransport) -> None:
        self._transport = transport
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._wake: Callable[[], None] = _nothing
        self._releaser = ThreadPoolExecutor(1, thread_name_prefix="pdserve-kv-release")
        self._exports: dict[str, _Export] = {}  # by exporting request id
        self._dones: dict[str, FinishedExport | TransferError] = {}  # until the worker takes them
        self._sources: dict[str, KVHandle] = {}  # by transfer id
        self._queued: dict[str, _Pull] = {}  # by importing request id
        self._tasks: dict[str, TransferTask] = {}  # pulls whose end the engine waits for
        self._stopping: dict[str, TransferTask] = {}  # cancelled pulls into held blocks
        self._ended_imports: list[ImportEnded] = []
        self._freed_exports: list[str] = []
        self._stopped_writes: list[str] = []

    @property
    def transport(self) -> KVTransport:
        """The transport the connector moves KV through."""
        return self._transport

    # -- the role worker's side: handles -----------------------------------------------------------

    def open_export(self, request_id: str, num_blocks: int) -> KVHandle:
        """Open the pipelined export of a prefill about to run; its handle may be pulled from
        at once."""
        export = _Export(None)
        handle = self._transport.open_export(
            num_blocks, on_release=functools.partial(self._export_released, request_id, export)
        )
        export.handle = handle
        with self._lock:
            self._exports[request_id] = export
        return handle

    def export_when_finished(self, request_id: str) -> None:
        """Export the blocks of a prefill about to run in one piece once it finished (see
        :meth:`take_finished_export`)."""
        with self._lock:
            self._exports[request_id] = _Export(None)

    def abandon_export(self, request_id: str) -> None:
        """Free the request's export now unless it already is (any thread)."""
        with self._lock:
            export = self._exports.pop(request_id, None)
            self._dones.pop(request_id, None)
        if export is not None and export.handle is not None:
            self._release(export.handle)

    def take_finished_export(self, request_id: str) -> FinishedExport | TransferError | None:
        """The request's export once its prefill finished (each told once): its handle and
        first token; the transport's refusal of a one-shot export; None when the export ended
        before its prefill did (or the prefill never finished). The worker takes it on every
        way out (it is kept until then, even once the export was pulled and freed)."""
        with self._lock:
            return self._dones.pop(request_id, None)

    @property
    def num_exports(self) -> int:
        """Exports not freed yet (pinned blocks a decode may still pull)."""
        with self._lock:
            return sum(1 for export in self._exports.values() if export.handle is not None)

    def add_source(self, handle: KVHandle) -> KVImportSource:
        """Remember an exporter's handle; the source an import names to pull from it."""
        with self._lock:
            self._sources[handle.transfer_id] = handle
        return KVImportSource(handle.transfer_id)

    def discard_source(self, source: KVImportSource) -> None:
        """The import from ``source`` never reached the engine: release the export (its
        exporter still pins the blocks; off this thread). A no-op once imported."""
        with self._lock:
            handle = self._sources.pop(source.export_id, None)
        if handle is not None:
            self._release_remote(handle)

    def pull_pending(self, request_id: str) -> bool:
        """True while the request's pull waits to start or its exporter has not begun sending
        (the export's lease needs heartbeats meanwhile)."""
        with self._lock:
            if request_id in self._queued:
                return True
            task = self._tasks.get(request_id)
        return task is not None and task.state is TransferState.PENDING

    # -- scheduler side ---------------------------------------------------------------------------

    def export_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Add these computed blocks to the request's export."""
        with self._lock:
            export = self._exports.get(request_id)
        if export is None or export.handle is None:
            return  # freed meanwhile, or one-shot
        try:
            self._transport.add_ready(export.handle, block_ids)
            export.num_added += len(block_ids)
        except TransferError as e:  # the importer released it or it expired
            logger.info("request %s: export no longer grows: %s", request_id, e)

    def export_finished(self, pinned: PinnedBlocks) -> None:
        """Finish the export with the rest of the pinned blocks and the first token (a
        one-shot export is made now, of every pinned block)."""
        request_id = pinned.request_id
        with self._lock:
            export = self._exports.get(request_id)
        if export is None:
            self._report_freed(request_id)  # freed before its prefill ended: unpin
            return
        done = ExportDone(pinned.first_token_id, pinned.prompt_chunk_ends)
        try:
            if export.handle is None:
                handle = self._transport.export(
                    pinned.block_ids,
                    on_release=functools.partial(self._export_released, request_id, export),
                )
                export.handle = handle
            else:
                rest = pinned.block_ids[export.num_added :]
                self._transport.finish_export(export.handle, rest, done)
        except TransferError as e:
            logger.info("request %s: export ended before its prefill: %s", request_id, e)
            with self._lock:
                if self._exports.get(request_id) is export and export.handle is None:
                    del self._exports[request_id]
                    self._dones[request_id] = e  # the one-shot export was refused
            self._report_freed(request_id)
            return
        with self._lock:
            abandoned = self._exports.get(request_id) is not export
            if not abandoned:
                self._dones[request_id] = FinishedExport(export.handle, done)
        if abandoned:  # the worker gave up while the one-shot export was being made
            self._release(export.handle)

    def import_blocks(self, allocation: ImportAllocation, source: KVImportSource) -> None:
        """Queue the pull of the allocation's missing blocks from ``source``'s handle.

        Raises :class:`LayoutMismatchError` when the export's block count differs from the
        allocation's (the source stays; see :meth:`discard_source`)."""
        missing = allocation.missing_block_indices
        with self._lock:
            handle = self._sources[source.export_id]
            if handle.num_blocks != len(allocation.block_ids):
                raise LayoutMismatchError(
                    f"request {allocation.request_id}: the export holds {handle.num_blocks} "
                    f"blocks, the prompt needs {len(allocation.block_ids)} here"
                )
            del self._sources[source.export_id]
            self._queued[allocation.request_id] = _Pull(
                handle, [allocation.block_ids[i] for i in missing], missing
            )

    def before_free(self, request_id: str) -> BlockRelease:
        """Drop a queued pull (releasing its export), cancel a running one (its blocks are held
        until it stopped: never waited for here), or release the request's export."""
        with self._lock:
            queued = self._queued.pop(request_id, None)
            task = self._tasks.pop(request_id, None)
            export = self._exports.pop(request_id, None)
            if task is not None:
                # NOTE: a freed block may be reused at once: the pull must stop writing it first
                self._stopping[request_id] = task
        if queued is not None:
            self._release_remote(queued.handle)
        if export is not None and export.handle is not None:
            self._release(export.handle)
        if task is None:
            return BlockRelease.NOW
        task.cancel()
        return BlockRelease.HELD

    # -- worker side ------------------------------------------------------------------------------

    def start_transfers(self) -> None:
        """Start the queued pulls (they run on the transport's threads)."""
        with self._lock:
            if not self._queued:
                return
            queued, self._queued = self._queued, {}
        for request_id, pull in queued.items():
            try:
                task = self._transport.pull(pull.handle, pull.dst_block_ids, pull.wanted_indices)
            except TransferError as e:
                failure = TransferFailure(e.reason) if e.reason in _REASONS else None
                self._end(ImportEnded(request_id, ImportResult.FAILED, failure=failure,
                                      message=e.message))  # fmt: skip
                continue
            with self._lock:
                self._tasks[request_id] = task
            task.add_done_callback(functools.partial(self._pull_ended, request_id))

    def wait(self, timeout_s: float) -> bool:
        """Block until a pull ended or an export was freed, at most ``timeout_s``."""
        with self._ended:
            return self._ended.wait_for(self._has_finished, timeout_s)

    def take_finished(self) -> KVConnectorFinished:
        """The pulls that ended, the exports freed and the cancelled pulls that stopped."""
        with self._lock:
            finished = KVConnectorFinished(
                tuple(self._ended_imports),
                tuple(self._freed_exports),
                tuple(self._stopped_writes),
            )
            self._ended_imports.clear()
            self._freed_exports.clear()
            self._stopped_writes.clear()
        return finished

    def set_wake(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` whenever a pull ends, an export is freed or a cancelled pull stopped."""
        self._wake = wake

    def close(self) -> None:
        """Stop the connector's release thread (after the transport closed)."""
        self._releaser.shutdown(wait=True)

    # -- transport callbacks (any thread) -----------------------------------------------------

    def _pull_ended(self, request_id: str, task: TransferTask) -> None:
        with self._lock:
            if self._stopping.get(request_id) is task:
                del self._stopping[request_id]
                self._stopped_writes.append(request_id)
                self._ended.notify_all()
                stopped = True
            elif self._tasks.get(request_id) is task:
                del self._tasks[request_id]
                stopped = False
            else:
                return
        if stopped:
            self._wake()
        else:
            self._end(_ended(request_id, task))

    def _export_released(self, request_id: str, export: _Export, cause: ReleaseCause) -> None:
        logger.debug("request %s: export released (%s)", request_id, cause)
        with self._lock:
            if self._exports.get(request_id) is export:
                del self._exports[request_id]
        self._report_freed(request_id)

    def _end(self, ended: ImportEnded) -> None:
        with self._ended:
            self._ended_imports.append(ended)
            self._ended.notify_all()
        self._wake()

    def _report_freed(self, request_id: str) -> None:
        with self._ended:
            self._freed_exports.append(request_id)
            self._ended.notify_all()
        self._wake()

    def _has_finished(self) -> bool:
        return bool(self._ended_imports or self._freed_exports or self._stopped_writes)

    def _release(self, handle: KVHandle) -> None:
        try:
            self._transport.release(handle)
        except TransferError as e:
            logger.debug("releasing %s: %s", handle.transfer_id, e)

    def _release_remote(self, handle: KVHandle) -> None:
        try:
            self._releaser.submit(self._release, handle)
        except RuntimeError:  # closed: the export's lease bounds it
            logger.warning("could not release kv export %s (closing)", handle.transfer_id)


def _ended(request_id: str, task: TransferTask) -> ImportEnded:
    """How a pull that nobody cancelled ended."""
    status = task.status()
    if status.state is not TransferState.DONE:
        return ImportEnded(
            request_id, ImportResult.FAILED, failure=status.reason, message=status.message
        )
    done = task.export_done
    return ImportEnded(
        request_id,
        ImportResult.READY,
        None if done is None else done.first_token_id,
        () if done is None else done.prompt_chunk_ends,
        host_block_ids=() if task.on_device else tuple(task.dst_block_ids),
    )
