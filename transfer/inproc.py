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
from core.kv_handle import KVHandle, TransferFailure
from transfer.block_store import BlockStore
from transfer.checksums import ACCEPTED_CHECKSUMS
from transfer.chunks import ChunkData, to_chunk_data
from transfer.exporter import KVExporter
from transfer.faults import FaultInjection
from transfer.importer import ImportRunner
from transfer.leases import OnRelease
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

    def __init__(self, hub: InProcKVHub, handle: KVHandle, wanted: list[int]) -> None:
        self._hub = hub
        self._handle = handle
        self._wanted = wanted
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
    ) -> None:
        self.metrics = metrics or InMemoryTransferMetrics()
        self._hub = hub
        self.exporter = KVExporter(
            store,
            address=hub.new_address(),
            lease_s=lease_s,
            chunk_bytes=chunk_bytes,
            metrics=self.metrics,
            faults=faults,
        )
        hub.register(self.exporter)
        self._runner = ImportRunner(store, num_threads=num_threads, metrics=self.metrics)

    @property
    def address(self) -> str:
        """This worker's ``inproc://N`` address."""
        return self.exporter.address

    def export(self, block_ids: Sequence[int], on_release: OnRelease | None = None) -> KVHandle:
        """Pin ``block_ids`` under a lease; see ``KVTransport.export``."""
        return self.exporter.export(block_ids, on_release)

    def pull(
        self,
        handle: KVHandle,
        dst_block_ids: Sequence[int],
        wanted_indices: Sequence[int] | None = None,
    ) -> TransferTask:
        """Pull from the exporter at ``handle.address``; see ``KVTransport.pull``."""
        return self._runner.submit(
            handle,
            dst_block_ids,
            wanted_indices,
            lambda h, wanted: _InProcChunkStream(self._hub, h, wanted),
            self.release,
        )

    def connect(self, address: str) -> None:
        """Nothing to do in one process."""

    def heartbeat(self, handle: KVHandle) -> int:
        """Extend the export's lease."""
        return self._hub.lookup(handle.address).heartbeat(handle.transfer_id)

    def release(self, handle: KVHandle) -> None:
        """Free an export on its exporter."""
        self._hub.lookup(handle.address).release(handle.transfer_id)

    def set_faults(self, faults: FaultInjection) -> None:
        """Inject ``faults`` into every pull this worker serves from now on."""
        self.exporter.faults = faults

    def close(self) -> None:
        """Cancel in-flight pulls, unregister, and free every export."""
        self._runner.close()
        self._hub.unregister(self.address)
        self.exporter.close()
