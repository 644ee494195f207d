"""The import side's logic, independent of the wire: run pulls off the caller's thread.

:class:`ImportRunner` validates a pull request, hands back a :class:`~transfer.task.TransferTask`
at once and runs the pull (:class:`~transfer.pull.Pull`: its streams, split or pipelined) on a
small thread pool, so a decode engine keeps stepping while KV arrives. Any failure ends the task
FAILED(reason) with the destination blocks that lack verified data and releases the export, so
neither side leaks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from core.errors import TransferError
from core.kv_compat import KVCompat
from core.kv_handle import KVHandle, TransferFailure
from transfer.block_store import BlockStore, check_block_ids
from transfer.pull import ExportPeer, ImportPiece, Pull, PullSetup, plan_import
from transfer.streams import StreamPlan
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


class ImportRunner:
    """Runs pulls into one block store on a thread pool and reports through tasks."""

    def __init__(
        self,
        store: BlockStore,
        *,
        num_threads: int,
        metrics: TransferMetrics,
        stall_s: float,
        plan: StreamPlan | None = None,
        rank_stores: Sequence[BlockStore] = (),
        kv_compat: KVCompat | None = None,
    ) -> None:
        """``num_threads`` pulls run at once; ``plan`` says how each is cut into streams
        (default: one stream per pull); a pipelined pull whose export gains no block for
        ``stall_s`` fails ``deadline_exceeded``. ``rank_stores``: on rank 0 of a
        tensor-parallel gang, every rank's store (``store`` first), filled head by head.
        ``kv_compat``: this importer's compatibility; a handle of another is refused."""
        self.store = store
        self.rank_stores: tuple[BlockStore, ...] = tuple(rank_stores) or (store,)
        plan = plan or StreamPlan(max_streams=1, min_stream_bytes=1)
        self._metrics = metrics
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="pdserve-kv-import")
        streams = ThreadPoolExecutor(
            num_threads * plan.max_streams, thread_name_prefix="pdserve-kv-stream"
        )
        fingerprint = store.layout.unsplit().fingerprint()
        self._setup = PullSetup(store, fingerprint, plan, streams, stall_s, kv_compat)
        self._lock = threading.Lock()
        self._running: dict[TransferTask, tuple[Future[None], KVHandle, ExportPeer]] = {}
        self._closed = False

    def submit(
        self,
        handle: KVHandle,
        dst_block_ids: Sequence[int],
        wanted_indices: Sequence[int] | None,
        peer: ExportPeer,
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
        pieces = plan_import(handle, self.rank_stores)
        if pieces is None:
            block_bytes = self.store.layout.block_bytes
        else:  # each piece moves its heads' share of every block, once
            layout = self.store.layout
            block_bytes = sum(layout.with_heads(p.shard.head_count).block_bytes for p in pieces)
        task = TransferTask(handle.transfer_id, tuple(dst_block_ids), len(wanted) * block_bytes)
        with self._lock:
            if self._closed:
                raise TransferError("importer is closed", reason=TransferFailure.CANCELLED)
            future = self._executor.submit(self._run, task, handle, wanted, peer, pieces)
            self._running[task] = (future, handle, peer)
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
        peer: ExportPeer,
        pieces: tuple[ImportPiece, ...] | None,
    ) -> None:
        started_s = time.perf_counter()
        self._metrics.transfer_started(TransferSide.IMPORT)
        pull = Pull(self._setup, task, handle, wanted, peer, pieces)
        failure: TransferError | None = None
        try:
            failure = pull.run()
        except Exception as e:  # a bug, not a transfer failure: still end the task
            logger.exception("kv transfer %s: unexpected error", handle.transfer_id)
            pull.cancel_streams()
            failure = TransferError(repr(e), reason=TransferFailure.INTERNAL)
        duration_s = time.perf_counter() - started_s
        reason = None if failure is None else TransferFailure(failure.reason)
        self._metrics.transfer_finished(TransferSide.IMPORT, pull.bytes_done, duration_s, reason)
        if failure is None:
            task.mark_done(pull.export_done)
            if pull.release_when_done is not None:  # the exporter still pins it
                self._release_quietly(handle, peer, completed=pull.release_when_done)
            return
        logger.warning("kv transfer %s failed (%s): %s", handle.transfer_id, reason, failure)
        task.mark_failed(TransferFailure(failure.reason), failure.message, pull.invalid_block_ids())
        if failure.reason not in _NO_RELEASE:
            self._release_quietly(handle, peer)

    @staticmethod
    def _release_quietly(handle: KVHandle, peer: ExportPeer, *, completed: bool = False) -> None:
        try:
            peer.release(handle, completed)
        except TransferError as e:
            logger.debug("release of kv export %s failed: %s", handle.transfer_id, e)

    def close(self) -> None:
        """Cancel every queued or running pull (they end FAILED(cancelled)) and stop the pool."""
        with self._lock:
            self._closed = True
            running = list(self._running.items())
        for task, (future, handle, peer) in running:
            if future.cancel():  # never started: end it here and free its export
                task.mark_failed(TransferFailure.CANCELLED, "importer closed", task.dst_block_ids)
                self._release_quietly(handle, peer)
            else:
                task.cancel()
        self._executor.shutdown(wait=True)
        self._setup.streams.shutdown(wait=True)
