"""The same-node path: a pull that copies blocks straight out of the exporter's shared memory.

When the exporter keeps its KV bytes in a named shared-memory segment (``core.shared_memory``) and
the importer runs on the same node, a pull need not move the bytes through a socket: the exporter
streams each chunk's *locations* (its block ids, and the checksum of those blocks' bytes in order)
and the importer maps the segment read-only, verifies each chunk's blocks there and copies them into
its own, as it would a chunk's payload. Leases, layout fingerprints and checksums apply as on the
gRPC path; the stream keeps the export pinned until the importer released it as completed, so no
block is freed while it is still being copied.

Which path a pull takes is :func:`transfer.paths.choose_path`'s decision.
"""

from __future__ import annotations

import mmap
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache

from core.errors import TransferError
from core.kv_handle import TransferFailure
from core.shared_memory import open_segment_readonly
from transfer.chunks import ChunkData, runs

GRPC_PATH = "grpc"
SAME_NODE_PATH = "same_node"


@cache
def local_node_id() -> str:
    """This machine's identity: its host name and kernel boot id (processes that share a node's
    memory share both)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "no-boot-id"
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True, slots=True)
class Locations:
    """One chunk of a same-node stream: where its whole blocks lie, and their bytes' checksum."""

    offset_bytes: int
    total_bytes: int
    checksum_algorithm: int
    checksum: int
    source_block_ids: tuple[int, ...]


def to_locations(
    offset_bytes: int,
    total_bytes: int,
    algorithm: int,
    checksum: int,
    source_block_ids: Sequence[int],
) -> Locations:
    """A location encoder for in-process pulls (the message itself)."""
    return Locations(offset_bytes, total_bytes, algorithm, checksum, tuple(source_block_ids))


class SharedRegion:
    """Another process's KV segment, mapped read-only; blocks read by id."""

    def __init__(self, name: str, block_bytes: int) -> None:
        """Raises ``OSError`` / ``ValueError`` when the segment cannot be mapped."""
        self.name = name
        self._map: mmap.mmap = open_segment_readonly(name)
        self._view = memoryview(self._map)
        self.block_bytes = block_bytes
        if len(self._view) % block_bytes:
            raise ValueError(f"segment {name} of {len(self._view)} bytes holds no whole blocks")
        self.num_blocks = len(self._view) // block_bytes

    def blocks(self, block_ids: Sequence[int]) -> tuple[memoryview, ...]:
        """Read-only views of the blocks, one per run of consecutive ids; ``TransferError`` for
        an id outside the region."""
        bad = [b for b in block_ids if not 0 <= b < self.num_blocks]
        if bad:
            raise TransferError(
                f"blocks {bad[:8]} lie outside the shared region {self.name} "
                f"({self.num_blocks} blocks)",
                reason=TransferFailure.BAD_CHUNK,
            )
        size = self.block_bytes
        return tuple(
            self._view[block_ids[i] * size : (block_ids[i] + n) * size] for i, n in runs(block_ids)
        )


class SharedRegions:
    """The regions one importer has mapped, by name (a region stays mapped while it is used)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, SharedRegion] = {}

    def get(self, name: str, block_bytes: int) -> SharedRegion:
        """The mapped region ``name`` (mapped now on first use); raises as ``SharedRegion``."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                region = self._regions[name] = SharedRegion(name, block_bytes)
            return region

    def forget(self, name: str) -> None:
        """Drop a region that failed (its exporter is gone); the mapping goes with its views."""
        with self._lock:
            self._regions.pop(name, None)


def closing_iter(locations: Iterable[Locations]) -> Iterator[Locations]:
    """``locations`` in order; when iteration stops early, the source is closed at once (an
    in-process exporter's generator then ends, and counts, now rather than when collected)."""
    iterator = iter(locations)
    try:
        yield from iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


class SameNodeStream:
    """A :class:`~transfer.pull.ChunkStream` over a stream of :class:`Locations`: each a
    chunk whose payload is the views of its blocks in the exporter's region."""

    def __init__(
        self, locations: Iterable[Locations], region: SharedRegion, cancel: Callable[[], None]
    ) -> None:
        self._locations = locations
        self._region = region
        self._cancel = cancel

    def __iter__(self) -> Iterator[ChunkData]:
        for chunk in closing_iter(self._locations):
            yield ChunkData(
                chunk.offset_bytes,
                chunk.total_bytes,
                chunk.checksum_algorithm,
                chunk.checksum,
                self._region.blocks(chunk.source_block_ids),
            )

    def cancel(self) -> None:
        """Stop the location stream."""
        self._cancel()
