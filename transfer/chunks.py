"""The chunk codec: cutting a run of blocks into checksummed chunks and writing them back.

A pull streams the wanted blocks back to back, in the order the request lists them, as one
logical byte string of ``len(wanted) * block_bytes``. That string is cut into chunks of at most
``chunk_bytes`` (1-4 MiB): a chunk may pack several small blocks or hold part of a large one, and
each carries its offset into the string and a zlib CRC-32 of its payload. The exporter takes
views of a chunk's block slices (:func:`chunk_pieces`), checksums them and copies them exactly
once, straight into the outgoing message (``transfer.codec``); the importer verifies a chunk's
offset, size and checksum on the received buffer and only then copies it into its destination
blocks (:class:`ChunkWriter`), so destination blocks never hold unverified bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from core.errors import TransferError
from core.kv_handle import TransferFailure
from transfer.block_store import BlockStore


@dataclass(frozen=True, slots=True)
class ChunkData:
    """One chunk of a pull, as the exporter produces it (mirrors the proto ``Chunk``)."""

    offset_bytes: int
    total_bytes: int
    crc32: int
    payload: bytes


def checksum(data: bytes | memoryview) -> int:
    """The chunk checksum: zlib CRC-32 as an unsigned 32-bit int."""
    return zlib.crc32(data) & 0xFFFFFFFF


def plan_chunks(total_bytes: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """``(offset_bytes, size_bytes)`` of every chunk of a ``total_bytes`` stream, in order."""
    for offset in range(0, total_bytes, chunk_bytes):
        yield offset, min(chunk_bytes, total_bytes - offset)


def byte_views(store: BlockStore, block_ids: Sequence[int]) -> list[memoryview]:
    """``store.block_view`` of each block as a flat unsigned-byte view, checked for size."""
    block_bytes = store.layout.block_bytes
    views = []
    for block_id in block_ids:
        view = store.block_view(block_id)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        if view.nbytes != block_bytes:
            raise TransferError(
                f"block {block_id} view has {view.nbytes} bytes, layout says {block_bytes}",
                reason=TransferFailure.INTERNAL,
            )
        views.append(view)
    return views


def chunk_pieces(
    views: Sequence[memoryview], block_bytes: int, offset: int, size: int
) -> list[bytes | memoryview]:
    """Views of the ``size`` bytes at ``offset`` of the concatenation of ``views`` (no copy)."""
    pieces: list[bytes | memoryview] = []
    while size > 0:
        index, start = divmod(offset, block_bytes)
        take = min(block_bytes - start, size)
        pieces.append(views[index][start : start + take])
        offset += take
        size -= take
    return pieces


def checksum_pieces(pieces: Sequence[bytes | memoryview]) -> int:
    """:func:`checksum` of the concatenation of ``pieces``."""
    crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return crc & 0xFFFFFFFF


def to_chunk_data(
    offset_bytes: int, total_bytes: int, crc32: int, pieces: Sequence[bytes | memoryview]
) -> ChunkData:
    """An encoder for in-process pulls: the pieces joined into one ``bytes`` (one copy)."""
    return ChunkData(offset_bytes, total_bytes, crc32, b"".join(pieces))


class ChunkWriter:
    """Verifies incoming chunks and writes them into preallocated destination blocks."""

    def __init__(self, store: BlockStore, dst_block_ids: Sequence[int]) -> None:
        self._block_bytes = store.layout.block_bytes
        self._views = byte_views(store, dst_block_ids)
        self._dst_block_ids = tuple(dst_block_ids)
        self.total_bytes = len(self._views) * self._block_bytes
        self.bytes_done = 0

    def write(
        self, offset_bytes: int, total_bytes: int, crc32: int, payload: bytes | memoryview
    ) -> None:
        """Check one chunk and copy it into place; raise ``TransferError`` if it is wrong."""
        size = len(payload)
        if total_bytes != self.total_bytes or offset_bytes != self.bytes_done:
            raise TransferError(
                f"chunk at offset {offset_bytes} of {total_bytes} bytes; expected offset "
                f"{self.bytes_done} of {self.total_bytes}",
                reason=TransferFailure.BAD_CHUNK,
            )
        if size == 0 or offset_bytes + size > self.total_bytes:
            raise TransferError(
                f"chunk of {size} bytes at offset {offset_bytes} overruns {self.total_bytes}",
                reason=TransferFailure.BAD_CHUNK,
            )
        source = memoryview(payload)
        if checksum(source) != crc32:
            raise TransferError(
                f"chunk at offset {offset_bytes} fails its CRC-32 check",
                reason=TransferFailure.CORRUPT_CHUNK,
            )
        done = 0
        while done < size:
            index, start = divmod(offset_bytes + done, self._block_bytes)
            take = min(self._block_bytes - start, size - done)
            self._views[index][start : start + take] = source[done : done + take]
            done += take
        self.bytes_done += size

    def finish(self) -> None:
        """Raise ``TransferError(bad_chunk)`` unless every byte arrived."""
        if self.bytes_done != self.total_bytes:
            raise TransferError(
                f"stream ended after {self.bytes_done} of {self.total_bytes} bytes",
                reason=TransferFailure.BAD_CHUNK,
            )

    def invalid_block_ids(self) -> tuple[int, ...]:
        """Destination blocks not completely written with verified bytes."""
        return self._dst_block_ids[self.bytes_done // self._block_bytes :]
