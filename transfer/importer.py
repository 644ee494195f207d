"""The import side's logic, independent of the wire: run pulls off the caller's thread.

:class:`ImportRunner` validates a pull request, hands back a :class:`~transfer.task.TransferTask`
at once and runs the pull on a small thread pool, so a decode engine keeps stepping while KV
arrives. A transport supplies two callables: ``open_stream`` (start the pull, return a
:class:`ChunkStream`) and ``release`` (free the export on the exporter). Every chunk goes through
a :class:`~transfer.chunks.ChunkWriter` (offset, size, checksum, then one copy into the
destination block). Any failure ends the task FAILED(reason) with the destination blocks that lack
verified data, cancels the stream and releases the export, so neither side leaks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from core.errors import TransferError
from core.kv_handle import KVHandle, TransferFailure
from transfer.block_store import BlockStore, check_block_ids
from transfer.chunks import ChunkWriter
from transfer.task import TransferTask
from transfer.transfer_metrics import TransferMetrics, TransferSide

logger = logging.getLogger(__name__)

# No Release after these: the export is already gone, we may not touch it, or another pull
# of it is running.
_NO_RELEASE = {
    TransferFailure.UNKNOWN_TRANSFER,
    TransferFailure.LEASE_EXPIRED,
    TransferFailure.PEER_RESTARTED,
    TransferFailure.UNAUTHENTICATED,
    TransferFailure.ALREADY_PULLING,
}


class ChunkLike(Protocol):
    """What a stream yields: a decoded ``ChunkView`` or a :class:`~transfer.chunks.ChunkData`."""

    @property
    def offset_bytes(self) -> int:
        """Offset of the payload in the pulled byte string."""
        ...

    @property
    def total_bytes(self) -> int:
        """Size of the whole pulled byte string."""
        ...

    @property
    def checksum_algorithm(self) -> int:
        """The ``ChecksumAlgorithm`` number of :attr:`checksum`."""
        ...

    @property
    def checksum(self) -> int:
        """The payload's checksum."""
        ...

    @property
    def payload(self) -> bytes | memoryview:
        """The chunk's bytes."""
        ...


class ChunkStream(Protocol):
    """A running pull: iterate for chunks, cancel to abandon it."""

    def __iter__(self) -> Iterator[ChunkLike]:
        """Chunks in stream order; failures raise ``TransferError`` with a reason."""
        ...

    def cancel(self) -> None:
        """Stop the pull and free what it holds; safe to call from any thread, twice."""
        ...


OpenStream = Callable[[KVHandle, list[int]], ChunkStream]
Release = Callable[[KVHandle], None]


class ImportRunner:
    """Runs pulls into one block store on a thread pool and reports through tasks."""

    def __init__(self, store: BlockStore, *, num_threads: int, metrics: TransferMetrics) -> None:
        self.store = store
        self._metrics = metrics
        self._fingerprint = store.layout.fingerprint()
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="pdserve-kv-import")
        self._lock = threading.Lock()
        self._running: dict[TransferTask, tuple[Future[None], KVHandle, Release]] = {}
        self._closed = False

    def submit(
        self,
        handle: KVHandle,
        dst_block_ids: Sequence[int],
        wanted_indices: Sequence[int] | None,
        open_stream: OpenStream,
        release: Release,
    ) -> TransferTask:
        """Start pulling ``wanted_indices`` of ``handle`` (default: all) into ``dst_block_ids``.

        Raises ``TransferError(invalid_request)`` at once for arguments that cannot be right
        (length mismatch, ids out of range or repeated); every other failure ends the task FAILED.
        """
        wanted = list(range(handle.num_blocks)) if wanted_indices is None else list(wanted_indices)
        if len(wanted) != len(dst_block_ids):
            raise TransferError(
                f"{len(wanted)} wanted blocks but {len(dst_block_ids)} destination blocks",
                reason=TransferFailure.INVALID_REQUEST,
            )
        bad = [i for i in wanted if not 0 <= i < handle.num_blocks]
        if bad or len(set(wanted)) != len(wanted):
            raise TransferError(
                f"wanted indices out of range [0, {handle.num_blocks}) or repeated: {wanted[:16]}",
                reason=TransferFailure.INVALID_REQUEST,
            )
        check_block_ids(self.store, dst_block_ids, "destination")
        task = TransferTask(
            handle.transfer_id, tuple(dst_block_ids), len(wanted) * self.store.layout.block_bytes
        )
        with self._lock:
            if self._closed:
                raise TransferError("importer is closed", reason=TransferFailure.CANCELLED)
            future = self._executor.submit(self._run, task, handle, wanted, open_stream, release)
            self._running[task] = (future, handle, release)
        future.add_done_callback(lambda _: self._forget(task))
        return task

    def _forget(self, task: TransferTask) -> None:
        with self._lock:
            self._running.pop(task, None)

    def num_in_flight(self) -> int:
        """Tasks queued or running."""
        with self._lock:
            return len(self._running)

    def _run(
        self,
        task: TransferTask,
        handle: KVHandle,
        wanted: list[int],
        open_stream: OpenStream,
        release: Release,
    ) -> None:
        started_s = time.perf_counter()
        self._metrics.transfer_started(TransferSide.IMPORT)
        writer = ChunkWriter(self.store, task.dst_block_ids)
        failure: TransferError | None = None
        try:
            failure = self._pull(task, handle, wanted, writer, open_stream)
        except Exception as e:  # a bug, not a transfer failure: still end the task
            logger.exception("kv transfer %s: unexpected error", handle.transfer_id)
            failure = TransferError(repr(e), reason=TransferFailure.INTERNAL)
        duration_s = time.perf_counter() - started_s
        reason = None if failure is None else TransferFailure(failure.reason)
        self._metrics.transfer_finished(TransferSide.IMPORT, writer.bytes_done, duration_s, reason)
        if failure is None:
            task.mark_done()
            if not wanted:  # nothing pulled, so the exporter still pins the blocks
                self._release_quietly(handle, release)
            return
        logger.warning("kv transfer %s failed (%s): %s", handle.transfer_id, reason, failure)
        task.mark_failed(
            TransferFailure(failure.reason), failure.message, writer.invalid_block_ids()
        )
        if failure.reason not in _NO_RELEASE:
            self._release_quietly(handle, release)

    def _pull(
        self,
        task: TransferTask,
        handle: KVHandle,
        wanted: list[int],
        writer: ChunkWriter,
        open_stream: OpenStream,
    ) -> TransferError | None:
        task.mark_transferring()
        if handle.layout_fingerprint != self._fingerprint:
            return TransferError(
                f"exporter layout {handle.layout_fingerprint} != importer layout "
                f"{self._fingerprint} ({self.store.layout})",
                reason=TransferFailure.LAYOUT_MISMATCH,
            )
        if not wanted:
            return None
        try:
            stream = open_stream(handle, wanted)
        except TransferError as e:
            return e
        task.set_cancel_hook(stream.cancel)
        chunks = iter(stream)
        try:
            writer.prepare()  # overlaps the exporter's work on the first chunk
            for chunk in chunks:
                writer.write(
                    chunk.offset_bytes,
                    chunk.total_bytes,
                    chunk.checksum_algorithm,
                    chunk.checksum,
                    chunk.payload,
                )
                task.mark_progress(writer.bytes_done)
            writer.finish()
        except TransferError as e:
            stream.cancel()
            if task.cancel_requested:
                return TransferError("cancelled by the importer", reason=TransferFailure.CANCELLED)
            return e
        except BaseException:
            stream.cancel()
            raise
        finally:
            task.set_cancel_hook(None)
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # end the stream's generator now, not at garbage collection
        return None

    @staticmethod
    def _release_quietly(handle: KVHandle, release: Release) -> None:
        try:
            release(handle)
        except TransferError as e:
            logger.debug("release of kv export %s failed: %s", handle.transfer_id, e)

    def close(self) -> None:
        """Cancel every queued or running pull (they end FAILED(cancelled)) and stop the pool."""
        with self._lock:
            self._closed = True
            running = list(self._running.items())
        for task, (future, handle, release) in running:
            if future.cancel():  # never started: end it here and free its export
                task.mark_failed(TransferFailure.CANCELLED, "importer closed", task.dst_block_ids)
                self._release_quietly(handle, release)
            else:
                task.cancel()
        self._executor.shutdown(wait=True)
