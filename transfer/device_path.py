"""The device path: a same-node pull whose blocks go from the exporter's device KV straight into
the importer's, never through host memory or a socket (CUDA IPC on GPUs).

An exporter whose store can share its device KV (:class:`DeviceKV`, the engine's ``KVStorage``
on CUDA) names it in every handle (``KVHandle.device_region``). An importer on the same node,
with ``transfer.same_node: auto`` and a store that can map it, asks for a stream of locations
with ``device`` set: the exporter waits until each chunk's blocks are computed on its device and
sends their ids (no checksum: nothing crosses a wire or host memory), and the importer copies
them device to device (:class:`DeviceCopyWriter`), then waits for its copies before the pull
counts as done. Its blocks are then already in the importer's device KV: nothing is staged from
the host mirror afterwards (``TransferTask.on_device``). Leases, layout fingerprints and the
stream's lifetime apply as on the other paths; the importer falls back to the shared-memory or
gRPC path when the region cannot be mapped (counted as ``ipc_unavailable``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from core.errors import TransferError
from core.kv_handle import TransferFailure
from transfer.same_node import Locations, closing_iter

logger = logging.getLogger(__name__)

DEVICE_PATH = "cuda_ipc"
"""The device path's name in ``pdserve:kv_transfer_pulls_total{path}``."""
NO_CHECKSUM = 2
"""``ChecksumAlgorithm.CHECKSUM_ALGORITHM_NONE`` on the wire: a device stream's chunks carry
none (their blocks never leave device memory), and no byte chunk may claim it."""
DEVICE_CHUNK_BYTES = 64 << 20
"""Bytes of blocks one location message of a device stream names: each is one copy launch, and
the device moves 64 MiB in well under a millisecond."""


class PeerCopier(Protocol):
    """An exporter's device KV, mapped into the importer's process."""

    def copy_blocks(self, src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> None:
        """Start copying the peer's ``src_block_ids`` into this store's ``dst_block_ids``."""
        ...

    def fence(self) -> None:
        """Block until every copy started so far has finished."""
        ...


@runtime_checkable
class DeviceKV(Protocol):
    """A block store whose device KV same-node peers can map (the engine's ``KVStorage``)."""

    @property
    def device_region(self) -> str | None:
        """This store's shareable device region (None: it has none, e.g. on a CPU)."""
        ...

    def wait_computed(self, block_ids: Sequence[int]) -> None:
        """Block until the device bytes of these exported blocks are final."""
        ...

    def open_device_peer(self, region: str) -> PeerCopier:
        """Map another store's ``device_region`` for copies into this one; ``ValueError`` or
        ``RuntimeError`` when it cannot be mapped."""
        ...


def device_region_of(store: object) -> str:
    """``store``'s device region, or "" when it has none."""
    return (store.device_region or "") if isinstance(store, DeviceKV) else ""


class DevicePeers:
    """The peers one importer has mapped, by region (a mapping is kept while it is used)."""

    def __init__(self, store: object) -> None:
        self._store = store if isinstance(store, DeviceKV) else None
        self._lock = threading.Lock()
        self._peers: dict[str, PeerCopier] = {}

    def get(self, region: str) -> PeerCopier | None:
        """The mapped peer (mapped now on first use); None when this store cannot copy from
        another device or the driver refuses the mapping (logged)."""
        if self._store is None:
            return None
        with self._lock:
            peer = self._peers.get(region)
            if peer is None:
                try:
                    peer = self._peers[region] = self._store.open_device_peer(region)
                except (ValueError, RuntimeError) as e:
                    logger.info("peer KV not mapped over CUDA IPC (%s): using host memory", e)
                    return None
            return peer

    def forget(self, region: str) -> None:
        """Drop a mapping whose exporter failed (a restarted exporter shares a new region)."""
        with self._lock:
            self._peers.pop(region, None)


class DeviceSource:
    """What a pull on the device path reads from: the exporter's mapped KV."""

    def __init__(self, region: str, peer: PeerCopier) -> None:
        self.region = region
        self.peer = peer


class DeviceStream:
    """A :class:`~transfer.pull.ChunkStream` of :class:`~transfer.same_node.Locations` for the
    device path (the writer copies the blocks they name)."""

    def __init__(self, locations: Iterable[Locations], cancel: Callable[[], None]) -> None:
        self._locations = locations
        self._cancel = cancel

    def __iter__(self) -> Iterator[Locations]:
        return closing_iter(self._locations)

    def cancel(self) -> None:
        """Stop the location stream."""
        self._cancel()


class DeviceCopyWriter:
    """Copies each located chunk's blocks from the peer into the destination blocks, in stream
    order; a block counts as written only after :meth:`finish` waited for its copy."""

    def __init__(self, peer: PeerCopier, dst_block_ids: Sequence[int], block_bytes: int) -> None:
        self._peer = peer
        self._dst_block_ids = tuple(dst_block_ids)
        self._block_bytes = block_bytes
        self.total_bytes = len(self._dst_block_ids) * block_bytes
        self.bytes_done = 0
        self._bytes_fenced = 0

    def prepare(self) -> None:
        """Nothing to fetch ahead: the destination is the store's device KV."""

    def take(self, chunk: Locations) -> None:
        """Check one located chunk and start copying its blocks; ``TransferError`` if wrong."""
        num_blocks = len(chunk.source_block_ids)
        if chunk.total_bytes != self.total_bytes or chunk.offset_bytes != self.bytes_done:
            raise TransferError(
                f"device chunk at offset {chunk.offset_bytes} of {chunk.total_bytes} bytes; "
                f"expected offset {self.bytes_done} of {self.total_bytes}",
                reason=TransferFailure.BAD_CHUNK,
            )
        if chunk.checksum_algorithm != NO_CHECKSUM or num_blocks == 0:
            raise TransferError(
                f"a device-path chunk names {num_blocks} blocks with checksum algorithm "
                f"{chunk.checksum_algorithm}: not a device stream",
                reason=TransferFailure.BAD_CHUNK,
            )
        first = self.bytes_done // self._block_bytes
        if first + num_blocks > len(self._dst_block_ids):
            raise TransferError(
                f"device chunk of {num_blocks} blocks at block {first} overruns "
                f"{len(self._dst_block_ids)}",
                reason=TransferFailure.BAD_CHUNK,
            )
        self._peer.copy_blocks(
            chunk.source_block_ids, self._dst_block_ids[first : first + num_blocks]
        )
        self.bytes_done += num_blocks * self._block_bytes

    def finish(self) -> None:
        """Wait for every copy; ``TransferError(bad_chunk)`` unless every block was named."""
        if self.bytes_done != self.total_bytes:
            raise TransferError(
                f"device stream ended after {self.bytes_done} of {self.total_bytes} bytes",
                reason=TransferFailure.BAD_CHUNK,
            )
        self._peer.fence()
        self._bytes_fenced = self.bytes_done

    def invalid_block_ids(self) -> tuple[int, ...]:
        """Destination blocks whose copy nobody waited for (all but a finished stream's)."""
        return self._dst_block_ids[self._bytes_fenced // self._block_bytes :]
