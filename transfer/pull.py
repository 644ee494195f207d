"""One pull, independent of the wire: the streams it opens on an export and how it drives them.

A transport supplies an :class:`ExportPeer`: how to open a stream of some blocks of an export,
release the export, and ask a pipelined export how far its prefill got. How a pull is cut up
(:class:`~transfer.streams.StreamPlan`): a small pull of a complete export is one stream
(completing it frees the export, the v1 protocol); a large one is split into several concurrent
streams over disjoint blocks; a pipelined export is pulled in segments as its blocks become
ready, each segment split the same way, so the transfer runs while the prefill still computes.
Split and pipelined pulls keep the export pinned until every wanted block arrived and then
release it as completed. Every stream writes through its own :class:`~transfer.chunks.ChunkWriter`
(offset, size, checksum, then one copy into the destination blocks); the first failure cancels
the other streams. Between tensor-parallel gangs (:func:`plan_import`) every block range is
pulled as one stream per piece of KV heads (``transfer.shards``), all keeping the export.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from core.errors import TransferError
from core.kv_compat import KVCompat
from core.kv_handle import ExportDone, KVHandle, TransferFailure
from core.tensor_parallel import plan_kv_pieces
from transfer.block_store import BlockStore
from transfer.chunks import ChunkWriter
from transfer.device_path import DeviceCopyWriter, DeviceSource
from transfer.paths import PullSource
from transfer.shards import KVShard, ShardWriter
from transfer.streams import StreamPlan
from transfer.task import TransferTask

_AWAIT_WAIT_S = 0.5
"""How long one Await asks the exporter to hold on (it answers at once when ready)."""


class ChunkStream(Protocol):
    """A running stream of some blocks of an export: iterate for chunks (what its writer
    takes: :class:`~transfer.chunks.ChunkLike`, or block locations on the device path),
    cancel to abandon it."""

    def __iter__(self) -> Iterator[Any]:
        """Chunks in stream order; failures raise ``TransferError`` with a reason."""
        ...

    def cancel(self) -> None:
        """Stop the stream and free what it holds; safe to call from any thread, twice."""
        ...


class ExportPeer(Protocol):
    """The exporter side of a pull, as a transport reaches it."""

    def open_stream(
        self,
        handle: KVHandle,
        wanted: list[int],
        keep_export: bool,
        source: PullSource | None = None,
        shard: KVShard | None = None,
    ) -> ChunkStream:
        """Start streaming ``wanted`` (export indices, in this order). ``keep_export``: one of
        several streams; the export stays pinned after it. ``source``: a same-node path,
        reading the blocks from the exporter's shared host or device KV (always keeps the
        export). ``shard``: only those heads of that exporter rank's blocks (never same-node)."""
        ...

    def choose_source(self, handle: KVHandle) -> PullSource | None:
        """Where this pull may read the exporter's blocks without the wire, else None (the
        choice is counted: ``transfer.paths``)."""
        ...

    def release(self, handle: KVHandle, completed: bool = False) -> None:
        """Free the export (``completed``: every wanted block arrived)."""
        ...

    def await_ready(
        self, handle: KVHandle, min_ready_blocks: int, wait_s: float
    ) -> tuple[int, ExportDone | None]:
        """A pipelined export's ready blocks (waiting up to ``wait_s`` for
        ``min_ready_blocks``) and, once its prefill finished, what it ended with."""
        ...


class StreamWriter(Protocol):
    """Where one stream's chunks land: bytes verified into destination blocks
    (:class:`~transfer.chunks.ChunkWriter`), or blocks copied device to device
    (:class:`~transfer.device_path.DeviceCopyWriter`)."""

    bytes_done: int
    """Bytes of the stream taken so far."""

    def prepare(self) -> None:
        """Get ready while the first chunk is on its way."""
        ...

    def take(self, chunk: Any) -> None:
        """Check one chunk of the stream and put it in place; ``TransferError`` if wrong."""
        ...

    def finish(self) -> None:
        """The stream ended: ``TransferError`` unless every byte arrived."""
        ...

    def invalid_block_ids(self) -> tuple[int, ...]:
        """Destination blocks without verified data."""
        ...


@dataclass(frozen=True)
class ImportPiece:
    """One stream's worth of a pull between tensor-parallel gangs: the exporter's shard, and
    where it lands: each target a destination rank's store and its local head there (several
    when the destination gang replicates those heads: moved once, placed in each)."""

    shard: KVShard
    targets: tuple[tuple[BlockStore, int], ...]


def plan_import(
    handle: KVHandle, rank_stores: Sequence[BlockStore]
) -> tuple[ImportPiece, ...] | None:
    """The pieces of a pull of ``handle`` into a gang with these stores (rank 0 first); None
    when both sides are one rank (a plain pull of whole blocks)."""
    if handle.tp_size == 1 and len(rank_stores) == 1:
        return None
    heads = rank_stores[0].layout.model_kv_heads
    try:
        planned = plan_kv_pieces(handle.tp_size, len(rank_stores), heads)
    except ValueError as e:
        raise TransferError(str(e), reason=TransferFailure.LAYOUT_MISMATCH) from e
    targets: dict[KVShard, list[tuple[BlockStore, int]]] = {}
    for piece in planned:
        shard = KVShard(piece.src_rank, piece.src_head, piece.num_heads)
        targets.setdefault(shard, []).append((rank_stores[piece.dst_rank], piece.dst_head))
    return tuple(ImportPiece(shard, tuple(places)) for shard, places in targets.items())


@dataclass(frozen=True)
class PullSetup:
    """What every pull of one importer shares."""

    store: BlockStore
    """Where the blocks land."""
    fingerprint: str
    """``store``'s layout fingerprint, which every handle must match."""
    plan: StreamPlan
    """How a pull is cut into streams."""
    streams: ThreadPoolExecutor
    """The threads the streams run on."""
    stall_s: float
    """How long a pipelined export may go without gaining a block."""
    kv_compat: KVCompat | None = None
    """What makes this importer's KV reusable; every handle's must be equal."""


class Pull:
    """One task's pull: its streams, their writers, and how far it got."""

    def __init__(
        self,
        setup: PullSetup,
        task: TransferTask,
        handle: KVHandle,
        wanted: list[int],
        peer: ExportPeer,
        pieces: tuple[ImportPiece, ...] | None = None,
    ) -> None:
        """``pieces``: a pull between tensor-parallel gangs, every piece streamed for every
        block range (None: whole blocks)."""
        self._setup = setup
        self._pieces = pieces
        self._task = task
        self._handle = handle
        self._peer = peer
        order = sorted(range(len(wanted)), key=wanted.__getitem__)
        self._wanted = [wanted[i] for i in order]  # export indices, ascending
        self._dst = [task.dst_block_ids[i] for i in order]
        self._lock = threading.Lock()
        self._streams: list[tuple[ChunkStream, StreamWriter, Future[TransferError | None]]] = []
        self._num_started = 0  # wanted blocks handed to a stream so far
        self._source: PullSource | None = None  # a same-node path's exporter KV
        self.export_done: ExportDone | None = None
        self.release_when_done: bool | None = None
        """Once every block arrived: None, the export is already freed (a v1 stream completed);
        True, release it as completed (split or pipelined); False, release it (nothing
        pulled)."""

    @property
    def bytes_done(self) -> int:
        """Verified bytes written by every stream so far."""
        with self._lock:
            return sum(writer.bytes_done for _, writer, _ in self._streams)

    def run(self) -> TransferError | None:
        """Pull every wanted block; the first failure (None: all arrived)."""
        task, handle = self._task, self._handle
        task.mark_transferring()
        if handle.layout_fingerprint != self._setup.fingerprint:
            return TransferError(
                f"exporter layout {handle.layout_fingerprint} != importer layout "
                f"{self._setup.fingerprint} ({self._setup.store.layout})",
                reason=TransferFailure.LAYOUT_MISMATCH,
            )
        if handle.kv_compat != self._setup.kv_compat:
            return TransferError(incompatibility(handle.kv_compat, self._setup.kv_compat),
                                 reason=TransferFailure.KV_INCOMPATIBLE)  # fmt: skip
        task.set_cancel_hook(self.cancel_streams)
        if self._wanted and self._pieces is None:
            self._source = self._peer.choose_source(handle)
            self._task.on_device = isinstance(self._source, DeviceSource)
        try:
            if handle.pipelined:
                return self._pull_as_ready()
            return self._pull_all()
        finally:
            task.set_cancel_hook(None)

    def _pull_all(self) -> TransferError | None:
        """A complete export: one stream, or several over disjoint blocks."""
        if not self._wanted:
            self.release_when_done = False
            return None
        parts = self._setup.plan.split(len(self._wanted), self._handle.block_bytes)
        if len(parts) == 1 and self._source is None and self._pieces is None:
            # v1: completing the stream frees the export
            self._start(0, len(self._wanted), keep_export=False)
            return self._wait_streams()
        self.release_when_done = True
        for start, end in parts:
            self._start(start, end, keep_export=True)
        return self._wait_streams()

    def _pull_as_ready(self) -> TransferError | None:
        """A pipelined export: pull each run of ready blocks as the prefill computes them."""
        self.release_when_done = True
        plan, block_bytes = self._setup.plan, self._handle.block_bytes
        segment = plan.min_segment_blocks(block_bytes)
        progress_s, last_ready = time.monotonic(), -1
        while True:
            if (failure := self._first_failure()) is not None:
                return self._wait_streams() or failure
            if self._task.cancel_requested:
                return self._cancelled()
            if time.monotonic() - progress_s > self._setup.stall_s:
                self.cancel_streams()
                self._wait_streams_quietly()
                return TransferError(
                    f"pipelined kv export {self._handle.transfer_id} gained no block for "
                    f"{self._setup.stall_s:g}s",
                    reason=TransferFailure.DEADLINE_EXCEEDED,
                )
            next_needed = self._wanted[self._num_started] if self._unstarted() else 0
            try:
                num_ready, done = self._peer.await_ready(
                    self._handle,
                    min(next_needed + segment, self._handle.num_blocks),
                    _AWAIT_WAIT_S,
                )
            except TransferError as e:
                self.cancel_streams()
                self._wait_streams()
                return e
            if done is not None:
                self.export_done = done
            if num_ready > last_ready or done is not None:
                progress_s, last_ready = time.monotonic(), num_ready
            ready = bisect.bisect_left(self._wanted, num_ready)  # wanted blocks now ready
            first = self._num_started
            if ready - first >= segment or (done is not None and self._unstarted()):
                for start, end in plan.split(ready - first, block_bytes):
                    self._start(first + start, first + end, keep_export=True)
            if done is not None and not self._unstarted():
                return self._wait_streams()

    def _unstarted(self) -> bool:
        return self._num_started < len(self._wanted)

    def _start(self, start: int, end: int, keep_export: bool) -> None:
        """Open a stream of ``wanted[start:end]`` (one per piece between gangs) and run it on
        the stream pool."""
        wanted, dst = self._wanted[start:end], self._dst[start:end]
        if self._pieces is None:
            source = self._source
            writer: StreamWriter = (
                DeviceCopyWriter(source.peer, dst, self._handle.block_bytes)
                if isinstance(source, DeviceSource)
                else ChunkWriter(self._setup.store, dst)
            )
            stream = self._peer.open_stream(self._handle, wanted, keep_export, source)
            self._run_stream(stream, writer)
        for piece in self._pieces or ():
            shard = piece.shard
            writer = ShardWriter(piece.targets, dst, shard.head_count)
            stream = self._peer.open_stream(self._handle, wanted, True, shard=shard)
            self._run_stream(stream, writer)
        with self._lock:
            self._num_started = max(self._num_started, end)

    def _run_stream(self, stream: ChunkStream, writer: StreamWriter) -> None:
        with self._lock:  # listed before its drain can count bytes_done
            future = self._setup.streams.submit(self._drain, stream, writer)
            self._streams.append((stream, writer, future))
        if self._task.cancel_requested:
            stream.cancel()

    def _drain(self, stream: ChunkStream, writer: StreamWriter) -> TransferError | None:
        """One stream's chunks into its writer (on the stream pool)."""
        chunks = iter(stream)
        try:
            writer.prepare()  # overlaps the exporter's work on the first chunk
            for chunk in chunks:
                writer.take(chunk)
                self._task.mark_progress(self.bytes_done)
            writer.finish()
        except TransferError as e:
            stream.cancel()
            return e
        except BaseException as e:
            stream.cancel()
            return TransferError(repr(e), reason=TransferFailure.INTERNAL)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # end the stream's generator now, not at garbage collection
        return None

    def _first_failure(self) -> TransferError | None:
        with self._lock:
            done = [future for _, _, future in self._streams if future.done()]
        return next((f.result() for f in done if f.result() is not None), None)

    def _wait_streams(self) -> TransferError | None:
        """Wait for every stream; on the first failure cancel the others."""
        with self._lock:
            futures = [future for _, _, future in self._streams]
        failure: TransferError | None = None
        for future in futures:
            result = future.result()
            if result is not None and failure is None:
                failure = result
                self.cancel_streams()
        if failure is not None and self._task.cancel_requested:
            return self._cancelled()
        return failure

    def _cancelled(self) -> TransferError:
        self.cancel_streams()
        self._wait_streams_quietly()
        return TransferError("cancelled by the importer", reason=TransferFailure.CANCELLED)

    def _wait_streams_quietly(self) -> None:
        with self._lock:
            futures = [future for _, _, future in self._streams]
        for future in futures:
            future.result()

    def cancel_streams(self) -> None:
        """Cancel every stream started so far (any thread)."""
        with self._lock:
            streams = [stream for stream, _, _ in self._streams]
        for stream in streams:
            stream.cancel()

    def invalid_block_ids(self) -> tuple[int, ...]:
        """Destination blocks without verified data: what each stream missed, and every block
        no stream was started for."""
        with self._lock:
            writers = [writer for _, writer, _ in self._streams]
            missed = [block for writer in writers for block in writer.invalid_block_ids()]
            missed += self._dst[self._num_started :]
        return tuple(dict.fromkeys(missed))  # pieces between gangs name a block once each


def incompatibility(exporter: KVCompat | None, importer: KVCompat | None) -> str:
    """Why an exporter's KV is not this importer's, naming each field that differs."""
    if exporter is None or importer is None:
        declared = "the importer" if exporter is None else "the exporter"
        return f"KV compatibility declared by {declared} only: refusing the pull"
    return "KV is not compatible: " + "; ".join(exporter.differences(importer))
