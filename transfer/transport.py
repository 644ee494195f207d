"""The ``KVTransport`` contract the roles program against, and its gRPC implementation.

A prefill worker exports blocks and hands the :class:`~core.kv_handle.KVHandle` on (or opens a
pipelined export before its prompt is computed and adds the blocks as they complete); a decode
worker pulls (some of) them into blocks it already allocated, heartbeats while it waits, and
releases an export it will not pull. :class:`GrpcKVTransport` is the real data plane;
``transfer.inproc.InProcKVTransport`` implements the same contract in one process for unit tests
of the roles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from core.config import TransferConfig
from core.errors import TransferError
from core.kv_compat import KVCompat
from core.kv_handle import ExportDone, KVHandle, TransferFailure
from transfer.block_store import BlockStore
from transfer.client import KVImportClient
from transfer.faults import FaultInjection
from transfer.leases import OnRelease
from transfer.server import KVExportServer
from transfer.task import TransferTask
from transfer.transfer_metrics import InMemoryTransferMetrics, TransferMetrics


class KVTransport(Protocol):
    """Moves paged KV blocks between the block stores of two workers."""

    def export(self, block_ids: Sequence[int], on_release: OnRelease | None = None) -> KVHandle:
        """Pin ``block_ids`` (in prompt order) under a lease and describe them in a handle.

        ``on_release(cause)`` is called exactly once when the blocks are no longer needed:
        the pull completed, the importer released them, the lease expired, or shutdown.
        """
        ...

    def open_export(self, num_blocks: int, on_release: OnRelease | None = None) -> KVHandle:
        """A pipelined export of ``num_blocks`` blocks of which none is computed yet: its handle
        can be pulled from at once, blocks arriving as :meth:`add_ready` adds them."""
        ...

    def add_ready(self, handle: KVHandle, block_ids: Sequence[int]) -> None:
        """The next computed blocks of a pipelined export, in prompt order."""
        ...

    def finish_export(self, handle: KVHandle, block_ids: Sequence[int], done: ExportDone) -> None:
        """A pipelined export's last computed blocks and what its prefill ended with."""
        ...

    def pull(
        self,
        handle: KVHandle,
        dst_block_ids: Sequence[int],
        wanted_indices: Sequence[int] | None = None,
    ) -> TransferTask:
        """Start pulling ``wanted_indices`` of ``handle`` (default: all) into ``dst_block_ids``.

        Returns at once; the transfer runs off the caller's thread. ``dst_block_ids[i]``
        receives block ``wanted_indices[i]``. A failed task names the destination blocks that
        hold no valid data and has released the export.
        """
        ...

    def connect(self, address: str) -> None:
        """Start connecting to the exporter at ``address`` now, so its first pull is faster.

        A hint: returns at once, may do nothing, and never fails a later pull.
        """
        ...

    def heartbeat(self, handle: KVHandle) -> int:
        """Extend the export's lease; returns the new deadline (ms since the Unix epoch)."""
        ...

    def release(self, handle: KVHandle) -> None:
        """Free an export that will not be pulled (or no longer needs to be)."""
        ...

    def set_faults(self, faults: FaultInjection) -> None:
        """Inject ``faults`` into every pull of this side's exports that starts from now on."""
        ...

    def close(self) -> None:
        """Cancel in-flight pulls, free every export and release all resources."""
        ...


class GrpcKVTransport:
    """:class:`KVTransport` over gRPC: an export server (optional) plus an import client."""

    def __init__(
        self,
        store: BlockStore,
        config: TransferConfig,
        *,
        serve: bool,
        node_host: str | None = None,
        metrics: TransferMetrics | None = None,
        faults: FaultInjection | None = None,
        rank_stores: Sequence[BlockStore] = (),
        kv_compat: KVCompat | None = None,
    ) -> None:
        """``serve=True`` starts the export server (prefill workers); decode workers pass False.
        ``rank_stores``: on rank 0 of a tensor-parallel gang, every rank's store (``store``
        first): exports serve each rank's heads, pulls fill each rank's heads. ``kv_compat``:
        this replica's KV compatibility (``core.kv_compat``), on every handle it exports and
        required of every handle it pulls."""
        self.metrics = metrics or InMemoryTransferMetrics()
        self.server = (
            KVExportServer(
                store,
                config,
                node_host=node_host,
                metrics=self.metrics,
                faults=faults,
                rank_stores=rank_stores,
                kv_compat=kv_compat,
            )
            if serve
            else None
        )
        self.client = KVImportClient(
            store, config, metrics=self.metrics, rank_stores=rank_stores, kv_compat=kv_compat
        )

    @property
    def address(self) -> str | None:
        """The export server's ``host:port``; None when not serving."""
        return None if self.server is None else self.server.address

    def export(self, block_ids: Sequence[int], on_release: OnRelease | None = None) -> KVHandle:
        """Pin ``block_ids`` under a lease; needs ``serve=True``."""
        return self._serving().export(block_ids, on_release)

    def open_export(self, num_blocks: int, on_release: OnRelease | None = None) -> KVHandle:
        """A pipelined export; needs ``serve=True``."""
        return self._serving().exporter.open_export(num_blocks, on_release)

    def add_ready(self, handle: KVHandle, block_ids: Sequence[int]) -> None:
        """A pipelined export's next computed blocks; needs ``serve=True``."""
        self._serving().exporter.add_ready(handle.transfer_id, block_ids)

    def finish_export(self, handle: KVHandle, block_ids: Sequence[int], done: ExportDone) -> None:
        """A pipelined export's last blocks and its end; needs ``serve=True``."""
        self._serving().exporter.finish(handle.transfer_id, block_ids, done)

    def _serving(self) -> KVExportServer:
        if self.server is None:
            raise TransferError(
                "this transport does not serve exports (serve=False)",
                reason=TransferFailure.EXPORTER_UNAVAILABLE,
            )
        return self.server

    def pull(
        self,
        handle: KVHandle,
        dst_block_ids: Sequence[int],
        wanted_indices: Sequence[int] | None = None,
    ) -> TransferTask:
        """Pull from the handle's exporter; see :meth:`KVTransport.pull`."""
        return self.client.pull(handle, dst_block_ids, wanted_indices)

    def connect(self, address: str) -> None:
        """Open the channel to ``address`` and start connecting (no wait)."""
        self.client.connect(address)

    def heartbeat(self, handle: KVHandle) -> int:
        """Extend the export's lease."""
        return self.client.heartbeat(handle)

    def release(self, handle: KVHandle) -> None:
        """Free an export on its exporter (this process's own exports without a round trip)."""
        if self.server is not None and handle.address == self.server.address:
            self.server.exporter.release(handle.transfer_id)
            return
        self.client.release(handle)

    def set_faults(self, faults: FaultInjection) -> None:
        """Inject ``faults`` into the export server's pulls; needs ``serve=True``."""
        self._serving().set_faults(faults)

    def close(self) -> None:
        """Close the client, then stop the server."""
        self.client.close()
        if self.server is not None:
            self.server.stop()
