"""The export side's logic, independent of the wire: exports, leases and chunk streams.

:class:`KVExporter` lives in the prefill worker's process next to its block store. ``export``
pins blocks under a lease and returns the :class:`~core.kv_handle.KVHandle`; ``open_export``
does so before the prompt is computed (a pipelined export that ``add_ready`` and ``finish`` grow,
and ``await_ready`` reports on); ``pull`` validates a pull (epoch, layout fingerprint, block
indices, ready blocks, one whole pull or disjoint split streams) and yields its chunks read
straight from the store, each checksummed (with the algorithm negotiated from the importer's
offer, ``transfer.checksums``) and copied once into the caller's message type by an
encoder (``transfer.chunk_wire.encode_chunk`` for gRPC). The gRPC servicer
(``transfer.server``) and the in-process transport (``transfer.inproc``) both drive it, so both
enforce the same rules and inject the same faults. Errors are ``TransferError`` with a
``TransferFailure`` reason, which the servicer maps to gRPC status codes.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TypeVar

from core.errors import TransferError
from core.ids import new_transfer_id
from core.kv_compat import KVCompat
from core.kv_handle import ExportDone, KVHandle, TransferFailure
from transfer.block_store import BlockStore, check_block_ids
from transfer.checksums import ChecksumAlgorithm, checksum_pieces, negotiate
from transfer.chunks import BlockViews, chunk_pieces, plan_chunks, pull_chunk_bytes
from transfer.device_path import DEVICE_CHUNK_BYTES, NO_CHECKSUM, DeviceKV, device_region_of
from transfer.faults import FaultInjection
from transfer.leases import Lease, LeaseTable, OnRelease, ReleaseCause
from transfer.shards import HeadSliceReader, KVShard, check_shard
from transfer.transfer_metrics import TransferMetrics, TransferSide

logger = logging.getLogger(__name__)

EncodedChunk = TypeVar("EncodedChunk")
ChunkEncoder = Callable[[int, int, ChecksumAlgorithm, int, list[bytes | memoryview]], EncodedChunk]
"""``encode(offset_bytes, total_bytes, algorithm, checksum, pieces)``: copies the pieces into a
message."""
LocationEncoder = Callable[[int, int, int, int, list[int]], EncodedChunk]
"""``encode(offset_bytes, total_bytes, algorithm, checksum, block_ids)``: a same-node chunk (the
checksum is of the blocks' bytes in order; ``NO_CHECKSUM`` and 0 on the device path)."""

_GONE_REASON = {
    ReleaseCause.EXPIRED: TransferFailure.LEASE_EXPIRED,
    ReleaseCause.SHUTDOWN: TransferFailure.EXPORTER_UNAVAILABLE,
    ReleaseCause.RELEASED: TransferFailure.UNKNOWN_TRANSFER,
    ReleaseCause.COMPLETED: TransferFailure.UNKNOWN_TRANSFER,
}


class KVExporter:
    """Pins exported blocks under leases and streams them to pullers."""

    def __init__(
        self,
        store: BlockStore,
        *,
        address: str,
        lease_s: float,
        chunk_bytes: int,
        metrics: TransferMetrics,
        faults: FaultInjection | None = None,
        node_id: str = "",
        rank_stores: Sequence[BlockStore] = (),
        kv_compat: KVCompat | None = None,
    ) -> None:
        """``kv_compat``: what makes this exporter's KV reusable, on every handle; a pull from an
        importer of another compatibility is refused. ``node_id``: this node's identity, put on
        every handle with the store's shared region (if its KV lives in shared memory) for
        same-node importers. ``rank_stores``: on
        rank 0 of a tensor-parallel gang, every rank's store (``store`` first), all under the
        same block ids; pulls then name a :class:`~transfer.shards.KVShard`."""
        self.store = store
        self.rank_stores: tuple[BlockStore, ...] = tuple(rank_stores) or (store,)
        if len(self.rank_stores) != store.layout.tp_size or self.rank_stores[0] is not store:
            raise TransferError(
                f"an exporter of a {store.layout.tp_size}-rank layout needs every rank's store, "
                f"its own first; got {len(self.rank_stores)}",
                reason=TransferFailure.INTERNAL,
            )
        self.node_id = node_id
        # a gang's heads lie in several regions: its pulls always move bytes (by shard)
        gang = len(self.rank_stores) > 1
        self.shared_region: str = "" if gang else getattr(store, "shared_region", None) or ""
        self.device_region = "" if gang else device_region_of(store)
        self.address = address
        self.epoch = secrets.token_hex(8)
        self.chunk_bytes = chunk_bytes
        self.faults = faults or FaultInjection()
        self._metrics = metrics
        self._fingerprint = store.layout.unsplit().fingerprint()
        self.kv_compat = kv_compat
        self._compat = "" if kv_compat is None else kv_compat.fingerprint()
        self._leases = LeaseTable(lease_s, metrics.lease_released)

    def export(self, block_ids: Sequence[int], on_release: OnRelease | None = None) -> KVHandle:
        """Pin ``block_ids`` (in prompt order) until pulled, released or expired."""
        check_block_ids(self.store, block_ids, "exported")
        return self._handle(Lease(new_transfer_id(), block_ids, on_release))

    def open_export(self, num_blocks: int, on_release: OnRelease | None = None) -> KVHandle:
        """A pipelined export of ``num_blocks`` blocks, none ready yet: :meth:`add_ready` adds them
        as the prefill computes them, :meth:`finish` ends it. ``on_release`` as for
        :meth:`export` (a freed export also stops growing)."""
        if num_blocks < 1:
            raise TransferError(
                f"an export holds at least one block, not {num_blocks}",
                reason=TransferFailure.INVALID_REQUEST,
            )
        return self._handle(Lease(new_transfer_id(), (), on_release, num_blocks=num_blocks))

    def _handle(self, lease: Lease) -> KVHandle:
        self._leases.add(lease)
        return KVHandle(
            transfer_id=lease.transfer_id,
            address=self.address,
            num_blocks=lease.num_blocks,
            block_bytes=self.store.layout.unsplit().block_bytes,
            layout_fingerprint=self._fingerprint,
            lease_deadline_unix_ms=int((time.time() + self._leases.lease_s) * 1000),
            exporter_epoch=self.epoch,
            pipelined=lease.pipelined,
            node_id=self.node_id,
            shared_region=self.shared_region,
            device_region=self.device_region,
            tp_size=len(self.rank_stores),
            kv_compat=self.kv_compat,
        )

    def add_ready(self, transfer_id: str, block_ids: Sequence[int]) -> None:
        """The next ready blocks of a pipelined export, in prompt order (computed and, on a GPU,
        staged where the store reads them)."""
        check_block_ids(self.store, block_ids, "exported")
        self._leases.add_ready(transfer_id, block_ids)

    def finish(self, transfer_id: str, block_ids: Sequence[int], done: ExportDone) -> None:
        """A pipelined export's last ready blocks and what its prefill ended with."""
        check_block_ids(self.store, block_ids, "exported")
        self._leases.finish(transfer_id, block_ids, done)

    def await_ready(
        self, transfer_id: str, min_ready_blocks: int, wait_s: float
    ) -> tuple[int, ExportDone | None]:
        """Wait (at most ``wait_s``) for ``min_ready_blocks`` ready blocks or the export's end;
        see :meth:`LeaseTable.await_ready`."""
        return self._leases.await_ready(transfer_id, min_ready_blocks, wait_s)

    def heartbeat(self, transfer_id: str) -> int:
        """Extend a lease; returns the new deadline in ms since the Unix epoch."""
        remaining_s = self._leases.extend(transfer_id)
        return int((time.time() + remaining_s) * 1000)

    def release(self, transfer_id: str, *, completed: bool = False) -> None:
        """Free an export now (``completed``: its importer pulled every block it wanted over
        split streams); ``TransferError`` if it is unknown (then nothing changes)."""
        self._leases.get(transfer_id)
        if self.faults.drop_release:
            logger.warning("fault injection: ignoring release of kv export %s", transfer_id)
            return
        cause = ReleaseCause.COMPLETED if completed else ReleaseCause.RELEASED
        self._leases.reclaim(transfer_id, cause)

    def pull(
        self,
        transfer_id: str,
        block_indices: Sequence[int],
        layout_fingerprint: str,
        exporter_epoch: str,
        cancelled: threading.Event,
        encode: ChunkEncoder[EncodedChunk],
        accepted_checksums: Sequence[int] = (),
        *,
        keep_export: bool = False,
        shard: KVShard | None = None,
        kv_compat: str = "",
    ) -> Generator[EncodedChunk, None, None]:
        """Validate a pull and stream its chunks, each made by ``encode``.

        ``block_indices`` are positions in the export (empty: all, in order), every one ready.
        ``cancelled`` is set when the puller goes away; it cuts injected delays short.
        ``accepted_checksums`` is the importer's offer (empty: CRC-32 only). ``keep_export``:
        one of several streams over disjoint blocks (or shards); the export stays pinned after
        it. ``shard``: only those heads of that rank's blocks (the only pulls a gang serves).
        ``kv_compat``: the importer's compatibility fingerprint, which must equal this one's.
        Validation errors raise here; failures while streaming raise from ``next()``.
        """
        wanted, algorithm = self._check_pull(
            transfer_id,
            block_indices,
            layout_fingerprint,
            exporter_epoch,
            accepted_checksums,
            kv_compat,
        )
        source = self._shard_source(shard)
        if shard is not None and not keep_export:
            raise TransferError(
                "a shard is one of several streams of an export: it needs keep_export",
                reason=TransferFailure.INVALID_REQUEST,
            )
        return self._stream(
            transfer_id,
            wanted,
            self.faults,
            cancelled,
            encode,
            algorithm,
            keep_export,
            source,
            shard,
        )

    def _shard_source(self, shard: KVShard | None) -> BlockStore:
        """What a pull of ``shard`` reads (refused for a gang without a shard)."""
        if shard is None:
            if len(self.rank_stores) > 1:
                raise TransferError(
                    f"this exporter's KV heads are split over {len(self.rank_stores)} "
                    "tensor-parallel ranks: pull them by shard",
                    reason=TransferFailure.INVALID_REQUEST,
                )
            return self.store
        check_shard(self.store.layout, len(self.rank_stores), shard)
        return HeadSliceReader(self.rank_stores[shard.rank], shard.head_start, shard.head_count)

    def pull_locations(
        self,
        transfer_id: str,
        block_indices: Sequence[int],
        layout_fingerprint: str,
        exporter_epoch: str,
        cancelled: threading.Event,
        encode: LocationEncoder[EncodedChunk],
        accepted_checksums: Sequence[int] = (),
        *,
        device: bool = False,
        kv_compat: str = "",
    ) -> Generator[EncodedChunk, None, None]:
        """A same-node pull: validated as :meth:`pull`, then the wanted blocks' ids in this
        exporter's shared region and a checksum of each, a chunk's worth at a time, each made
        by ``encode``. ``device``: the importer copies out of this exporter's device KV
        instead (``transfer.device_path``): each chunk's ids once its blocks are computed, with
        no checksum. The export stays pinned after the stream (the importer copies the blocks
        afterwards and releases it as completed)."""
        if not (self.device_region if device else self.shared_region):
            where = "shareable device memory" if device else "shared memory"
            raise TransferError(
                f"this exporter's KV is not in {where}: pull its bytes instead",
                reason=TransferFailure.INVALID_REQUEST,
            )
        wanted, algorithm = self._check_pull(
            transfer_id,
            block_indices,
            layout_fingerprint,
            exporter_epoch,
            accepted_checksums,
            kv_compat,
        )
        return self._locate(transfer_id, wanted, self.faults, cancelled, encode, algorithm, device)

    def _check_pull(
        self,
        transfer_id: str,
        block_indices: Sequence[int],
        layout_fingerprint: str,
        exporter_epoch: str,
        accepted_checksums: Sequence[int],
        kv_compat: str,
    ) -> tuple[list[int], ChecksumAlgorithm]:
        """The wanted indices and the checksum algorithm of a valid pull; raises otherwise."""
        if exporter_epoch and exporter_epoch != self.epoch:
            raise TransferError(
                f"exporter restarted: handle epoch {exporter_epoch}, now {self.epoch}",
                reason=TransferFailure.PEER_RESTARTED,
            )
        lease = self._leases.get(transfer_id)
        if layout_fingerprint != self._fingerprint:
            raise TransferError(
                f"layout fingerprint {layout_fingerprint} != exporter's {self._fingerprint} "
                f"({self.store.layout})",
                reason=TransferFailure.LAYOUT_MISMATCH,
            )
        if kv_compat != self._compat:
            raise TransferError(
                f"importer KV compatibility {kv_compat or 'undeclared'} != exporter's "
                f"{self._compat or 'undeclared'} ({self.kv_compat}): refusing the pull",
                reason=TransferFailure.KV_INCOMPATIBLE,
            )
        wanted = list(block_indices) or list(range(lease.num_blocks))
        bad = [i for i in wanted if not 0 <= i < lease.num_blocks]
        if bad or len(set(wanted)) != len(wanted):
            raise TransferError(
                f"block indices out of range [0, {lease.num_blocks}) or repeated: {wanted[:16]}",
                reason=TransferFailure.INVALID_REQUEST,
            )
        return wanted, negotiate(accepted_checksums)

    def _stream(
        self,
        transfer_id: str,
        wanted: list[int],
        faults: FaultInjection,
        cancelled: threading.Event,
        encode: ChunkEncoder[EncodedChunk],
        algorithm: ChecksumAlgorithm,
        keep_export: bool,
        source: BlockStore,
        shard: KVShard | None,
    ) -> Generator[EncodedChunk, None, None]:
        def chunks(lease: Lease) -> Iterator[tuple[EncodedChunk, int]]:
            views = BlockViews(source, [lease.block_ids[i] for i in wanted])
            total_bytes = len(wanted) * source.layout.block_bytes
            chunk_bytes = pull_chunk_bytes(total_bytes, self.chunk_bytes)
            for seq, (offset, size) in enumerate(plan_chunks(total_bytes, chunk_bytes)):
                self._inject_before(seq, faults, cancelled)
                with lease.lock:
                    _check_live(lease)
                    pieces = chunk_pieces(views, offset, size)
                    digest = checksum_pieces(algorithm, pieces)
                    message = encode(
                        offset, total_bytes, algorithm, digest, faults.corrupt(seq, pieces)
                    )
                yield message, size

        return self._serve(transfer_id, wanted, keep_export, chunks, shard)

    def _locate(
        self,
        transfer_id: str,
        wanted: list[int],
        faults: FaultInjection,
        cancelled: threading.Event,
        encode: LocationEncoder[EncodedChunk],
        algorithm: ChecksumAlgorithm,
        device: bool,
    ) -> Generator[EncodedChunk, None, None]:
        store = self.store
        named = NO_CHECKSUM if device else algorithm

        def chunks(lease: Lease) -> Iterator[tuple[EncodedChunk, int]]:
            block_bytes = store.layout.block_bytes
            total_bytes = len(wanted) * block_bytes
            per_chunk = max(1, (DEVICE_CHUNK_BYTES if device else self.chunk_bytes) // block_bytes)
            for seq, start in enumerate(range(0, len(wanted), per_chunk)):
                self._inject_before(seq, faults, cancelled)
                with lease.lock:
                    _check_live(lease)
                    ids = [lease.block_ids[i] for i in wanted[start : start + per_chunk]]
                    size = len(ids) * block_bytes
                    if device and isinstance(store, DeviceKV):
                        store.wait_computed(ids)  # the importer reads the device bytes next
                        digest = 0
                    else:
                        views = BlockViews(store, ids)
                        digest = checksum_pieces(algorithm, chunk_pieces(views, 0, size))
                if faults.corrupt_chunk_seq == seq and not device:
                    digest ^= 1  # the same fault as a flipped byte: the check fails
                yield encode(start * block_bytes, total_bytes, named, digest, ids), size

        # the blocks stay pinned after the stream: the importer copies them, then releases
        return self._serve(transfer_id, wanted, True, chunks)

    def _serve(
        self,
        transfer_id: str,
        wanted: list[int],
        keep_export: bool,
        chunks: Callable[[Lease], Iterator[tuple[EncodedChunk, int]]],
        shard: KVShard | None = None,
    ) -> Generator[EncodedChunk, None, None]:
        """One pull's stream of ``chunks(lease)`` (each message with the bytes it stands for),
        bracketed by the lease's pull and the export-side metrics."""
        # on the first next(): paired with end_pull
        shard_key = None if shard is None else shard.key
        lease = self._leases.begin_pull(
            transfer_id, wanted, keep_export=keep_export, shard_key=shard_key
        )
        started_s = time.perf_counter()
        self._metrics.transfer_started(TransferSide.EXPORT)
        moved, completed = 0, False
        failure: TransferFailure | None = TransferFailure.CANCELLED
        try:
            for message, size in chunks(lease):
                self._leases.touch(lease)
                yield message
                moved += size
            completed, failure = True, None
        except TransferError as e:
            failure = TransferFailure(e.reason)
            raise
        except Exception:
            failure = TransferFailure.INTERNAL
            raise
        finally:
            self._leases.end_pull(
                lease,
                completed,
                wanted,
                keep_export=keep_export,
                shard_key=shard_key,
            )
            duration_s = time.perf_counter() - started_s
            self._metrics.transfer_finished(TransferSide.EXPORT, moved, duration_s, failure)

    @staticmethod
    def _inject_before(seq: int, faults: FaultInjection, cancelled: threading.Event) -> None:
        if faults.delay_per_chunk_s and cancelled.wait(faults.delay_per_chunk_s):
            raise TransferError("puller went away", reason=TransferFailure.CANCELLED)
        if faults.should_fail(seq):
            raise TransferError(
                f"fault injection: stream aborted after {seq} chunks",
                reason=TransferFailure.EXPORTER_ERROR,
            )

    def num_live_exports(self) -> int:
        """Exports whose blocks are still pinned."""
        return self._leases.num_live()

    def close(self) -> None:
        """Free every live export (cause SHUTDOWN) and stop the lease reaper."""
        self._leases.close()


def _check_live(lease: Lease) -> None:
    """Raise why ``lease`` was freed, if it was (the caller holds ``lease.lock``)."""
    if lease.released is not None:
        raise TransferError(
            f"kv export {lease.transfer_id} was freed mid-pull ({lease.released})",
            reason=_GONE_REASON[lease.released],
        )
