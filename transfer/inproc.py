"""An in-process :class:`~transfer.transport.KVTransport` for unit tests of the roles.

Workers in one process share an :class:`InProcKVHub`; each :class:`InProcKVTransport` registers
its exporter there under an ``inproc://N`` address, and pulls look the exporter up by the
handle's address. The same :class:`~transfer.exporter.KVExporter` and
:class:`~transfer.importer.ImportRunner` as the gRPC transport do the work, so leases,
validation, checksums, failure reasons and fault injection behave identically; only the wire
(and its auth and TLS) is missing.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence

from core.errors import TransferError
from core.kv_compat import KVCompat
from core.kv_handle import ExportDone, KVHandle, TransferFailure
from transfer.block_store import BlockStore
from transfer.checksums import ACCEPTED_CHECKSUMS
from transfer.chunks import ChunkData, to_chunk_data
from transfer.device_path import DeviceSource
from transfer.exporter import KVExporter
from transfer.faults import FaultInjection
from transfer.importer import ImportRunner
from transfer.leases import OnRelease
from transfer.paths import PathChooser, PullSource, source_stream
from transfer.pull import ChunkStream
from transfer.same_node import local_node_id, to_locations
from transfer.shards import KVShard
from transfer.streams import StreamPlan
from transfer.task import TransferTask
from transfer.transfer_metrics import InMemoryTransferMetrics, TransferMetrics


class InProcKVHub:
    """Address book of the in-process exporters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exporters: dict[str, KVExporter] = {}
        self._ids = itertools.count()

    def new_address(self) -> str:
        """A fresh ``inproc://N`` address."""
        return f"inproc://{next(self._ids)}"

    def register(self, exporter: KVExporter) -> None:
        """Make ``exporter`` reachable at its address."""
        with self._lock:
            self._exporters[exporter.address] = exporter

    def unregister(self, address: str) -> None:
        """Make ``address`` unreachable (the worker stopped)."""
        with self._lock:
            self._exporters.pop(address, None)

    def lookup(self, address: str) -> KVExporter:
        """The exporter at ``address``; ``TransferError(exporter_unavailable)`` if none."""
        with self._lock:
            exporter = self._exporters.get(address)
        if exporter is None:
            raise TransferError(
                f"no exporter at {address}", reason=TransferFailure.EXPORTER_UNAVAILABLE
            )
        return exporter


class _InProcChunkStream:
    """A pull served by calling the exporter directly."""

    def __init__(
        self,
        hub: InProcKVHub,
        handle: KVHandle,
        wanted: list[int],
        keep_export: bool,
        shard: KVShard | None,
        kv_compat: str,
    ) -> None:
        self._hub = hub
        self._kv_compat = kv_compat
        self._shard = shard
        self._handle = handle
        self._wanted = wanted
        self._keep_export = keep_export
        self._cancelled = threading.Event()

    def __iter__(self) -> Iterator[ChunkData]:
        exporter = self._hub.lookup(self._handle.address)
        chunks = exporter.pull(
            self._handle.transfer_id,
            self._wanted,
            self._handle.layout_fingerprint,
            self._handle.exporter_epoch,
            self._cancelled,
            to_chunk_data,
            ACCEPTED_CHECKSUMS,
            keep_export=self._keep_export,
            shard=self._shard,
            kv_compat=self._kv_compat,
        )
        try:
            for chunk in chunks:
                if self._cancelled.is_set():
                    raise TransferError("pull cancelled", reason=TransferFailure.CANCELLED)
                yield chunk
        finally:
            chunks.close()

    def cancel(self) -> None:
        self._cancelled.set()


class InProcKVTransport:
    """:class:`~transfer.transport.KVTransport` between workers in one process."""

    def __init__(
        self,
        store: BlockStore,
        hub: InProcKVHub,
        *,
        lease_s: float = 30.0,
        chunk_bytes: int = 2 * 1024 * 1024,
        num_threads: int = 2,
        metrics: TransferMetrics | None = None,
        faults: FaultInjection | None = None,
        plan: StreamPlan | None = None,
        same_node: str = "auto",
        rank_stores: Sequence[BlockStore] = (),
        kv_compat: KVCompat | None = None,
    ) -> None:
        """``plan``: how pulls are cut into streams (default: one stream a pull);
        ``same_node``: as ``transfer.same_node`` (read an exporter's shared KV directly);
        ``rank_stores``: every rank's store on rank 0 of a tensor-parallel gang;
        ``kv_compat``: this worker's KV compatibility, exported and required of exporters."""
        self.metrics = metrics or InMemoryTransferMetrics()
        self._hub = hub
        self.exporter = KVExporter(
            store,
            address=hub.new_address(),
            lease_s=lease_s,
            chunk_bytes=chunk_bytes,
            metrics=self.metrics,
            faults=faults,
            node_id=local_node_id(),
            rank_stores=rank_stores,
            kv_compat=kv_compat,
        )
        hub.register(self.exporter)
        self._kv_compat = "" if kv_compat is None else kv_compat.fingerprint()
        self._paths = PathChooser(same_node, store, self.metrics)
        self._runner = ImportRunner(
            store,
            num_threads=num_threads,
            metrics=self.metrics,
            stall_s=lease_s,
            plan=plan,
            rank_stores=rank_stores,
            kv_compat=kv_compat,
        )

    @property
    def address(self) -> str:
        """This worker's ``inproc://N`` address."""
        return self.exporter.address

    def export(self, block_ids: Sequence[int], on_release: OnRelease | None = None) -> KVHandle:
        """Pin ``block_ids`` under a lease; see ``KVTransport.export``."""
        return self.exporter.export(block_ids, on_release)

    def open_export(self, num_blocks: int, on_release: OnRelease | None = None) -> KVHandle:
        """A pipelined export; see ``KVTransport.open_export``."""
        return self.exporter.open_export(num_blocks, on_release)

    def add_ready(self, handle: KVHandle, block_ids: Sequence[int]) -> None:
        """A pipelined export's next ready blocks; see ``KVTransport.add_ready``."""
        self.exporter.add_ready(handle.transfer_id, block_ids)

    def finish_export(self, handle: KVHandle, block_ids: Sequence[int], done: ExportDone) -> None:
        """A pipelined export's last blocks and its end; see ``KVTransport.finish_export``."""
        self.exporter.finish(handle.transfer_id, block_ids, done)

    def pull(
        self,
        handle: KVHandle,
        dst_block_ids: Sequence[int],
        wanted_indices: Sequence[int] | None = None,
    ) -> TransferTask:
        """Pull from the exporter at ``handle.address``; see ``KVTransport.pull``."""
        return self._runner.submit(handle, dst_block_ids, wanted_indices, self)

    def open_stream(
        self,
        handle: KVHandle,
        wanted: list[int],
        keep_export: bool,
        source: PullSource | None = None,
        shard: KVShard | None = None,
    ) -> ChunkStream:
        """A stream served by calling the exporter at ``handle.address`` directly (its block
        locations, read from ``source``, on a same-node path)."""
        if source is None:
            return _InProcChunkStream(
                self._hub, handle, wanted, keep_export, shard, self._kv_compat
            )
        cancelled = threading.Event()
        locations = self._hub.lookup(handle.address).pull_locations(
            handle.transfer_id,
            wanted,
            handle.layout_fingerprint,
            handle.exporter_epoch,
            cancelled,
            to_locations,
            ACCEPTED_CHECKSUMS,
            device=isinstance(source, DeviceSource),
            kv_compat=self._kv_compat,
        )
        return source_stream(locations, source, cancelled.set)

    def choose_source(self, handle: KVHandle) -> PullSource | None:
        """Where a same-node pull of ``handle`` reads (None: in-process bytes); counted."""
        return self._paths.choose(handle)

    def await_ready(
        self, handle: KVHandle, min_ready_blocks: int, wait_s: float
    ) -> tuple[int, ExportDone | None]:
        """See ``ExportPeer.await_ready``."""
        exporter = self._hub.lookup(handle.address)
        return exporter.await_ready(handle.transfer_id, min_ready_blocks, wait_s)

    def connect(self, address: str) -> None:
        """Nothing to do in one process."""

    def heartbeat(self, handle: KVHandle) -> int:
        """Extend the export's lease."""
        return self._hub.lookup(handle.address).heartbeat(handle.transfer_id)

    def release(self, handle: KVHandle, completed: bool = False) -> None:
        """Free an export on its exporter."""
        self._hub.lookup(handle.address).release(handle.transfer_id, completed=completed)

    def set_faults(self, faults: FaultInjection) -> None:
        """Inject ``faults`` into every pull this worker serves from now on."""
        self.exporter.faults = faults

    def close(self) -> None:
        """Cancel in-flight pulls, unregister, and free every export."""
        self._runner.close()
        self._hub.unregister(self.address)
        self.exporter.close()
