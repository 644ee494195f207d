"""The chunk codec: cutting a run of blocks into checksummed chunks and writing them back.

A pull streams the wanted blocks back to back, in the order the request lists them, as one
logical byte string of ``len(wanted) * block_bytes``. That string is cut into chunks of at most
``chunk_bytes`` (1-4 MiB; smaller pulls get smaller chunks, :func:`pull_chunk_bytes`): a chunk
may pack several small blocks or hold part of a large one, and each carries its offset into the
string and a checksum of its payload (``transfer.checksums``). The exporter takes views of a
chunk's block slices (:func:`chunk_pieces`), checksums them and copies them exactly once,
straight into the outgoing message (``transfer.chunk_wire``); the importer verifies a chunk's
offset, size and checksum on the received buffer and only then copies it into its destination
blocks (:class:`ChunkWriter`), so destination blocks never hold unverified bytes. Block views
are fetched from the store as chunks need them (:class:`BlockViews`), not all before the first
byte.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.errors import TransferError
from core.kv_handle import TransferFailure
from transfer.block_store import BlockStore
from transfer.checksums import ChecksumAlgorithm, checksum_pieces

Payload = bytes | memoryview | tuple[memoryview, ...]
"""A chunk's bytes: one buffer, or (same-node) the views of its blocks, in order."""


@dataclass(frozen=True, slots=True)
class ChunkData:
    """One chunk of a pull, as the exporter produces it (mirrors the proto ``Chunk``)."""

    offset_bytes: int
    total_bytes: int
    checksum_algorithm: int
    checksum: int
    payload: Payload


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
    def payload(self) -> Payload:
        """The chunk's bytes (a same-node chunk's: its blocks' views)."""
        ...


MIN_CHUNK_BYTES = 1 << 20
"""Smallest chunk a pull is cut into (unless the configured chunk is smaller or the pull is)."""
MIN_CHUNKS_PER_PULL = 8
"""Pulls smaller than this many configured chunks get smaller chunks, down to 1 MiB."""
_CHUNK_ALIGN_BYTES = 64 * 1024


def pull_chunk_bytes(total_bytes: int, chunk_bytes: int) -> int:
    """The chunk size for one pull: ``chunk_bytes``, or less for a pull of under 8 chunks.

    A small pull (the KV of one prompt: a few MiB) cut into 1 MiB chunks instead of 2-4 MiB ones
    pipelines better: the importer verifies and places one chunk while the exporter reads and
    sends the next, so the last byte lands sooner. Never below 1 MiB, never above
    ``chunk_bytes``; rounded up to 64 KiB.
    """
    wanted = -(-total_bytes // MIN_CHUNKS_PER_PULL)
    wanted = -(-wanted // _CHUNK_ALIGN_BYTES) * _CHUNK_ALIGN_BYTES
    return min(chunk_bytes, max(MIN_CHUNK_BYTES, wanted))


def plan_chunks(total_bytes: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """``(offset_bytes, size_bytes)`` of every chunk of a ``total_bytes`` stream, in order."""
    for offset in range(0, total_bytes, chunk_bytes):
        yield offset, min(chunk_bytes, total_bytes - offset)


def runs(block_ids: Sequence[int]) -> list[tuple[int, int]]:
    """``(index, length)`` of each run of consecutive ids in ``block_ids``."""
    found: list[tuple[int, int]] = []
    start = 0
    for index in range(1, len(block_ids) + 1):
        if index == len(block_ids) or block_ids[index] != block_ids[index - 1] + 1:
            found.append((start, index - start))
            start = index
    return found


class BlockViews:
    """Flat unsigned-byte views of a list of blocks: each run of consecutive ids one view,
    fetched from the store on first use.

    A view costs microseconds (more on torch-backed storage) and every piece moved costs a copy
    call, so a run of blocks moves as one piece and a pull fetches views as its chunks reach
    them instead of all before the first byte moves. Each view is checked to be exactly as long
    as its blocks.
    """

    def __init__(self, store: BlockStore, block_ids: Sequence[int]) -> None:
        self.block_ids = tuple(block_ids)
        self.block_bytes = store.layout.block_bytes
        self._store = store
        self._runs = runs(self.block_ids)
        self._starts = [index for index, _ in self._runs]
        self._views: list[memoryview | None] = [None] * len(self._runs)

    def __len__(self) -> int:
        return len(self.block_ids)

    def span(self, offset: int) -> memoryview:
        """The bytes from ``offset`` (into the concatenation of the blocks) to the end of the
        run of blocks it falls in."""
        index, start = divmod(offset, self.block_bytes)
        run = bisect.bisect_right(self._starts, index) - 1
        view = self._views[run]
        if view is None:
            view = self._views[run] = self._fetch(*self._runs[run])
        return view[(index - self._starts[run]) * self.block_bytes + start :]

    def fetch_all(self) -> None:
        """Fetch every view now (e.g. while waiting for the first chunk)."""
        for index, _ in self._runs:
            self.span(index * self.block_bytes)

    def _fetch(self, index: int, length: int) -> memoryview:
        first = self.block_ids[index]
        view = self._store.blocks_view(first, length)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        if view.nbytes != length * self.block_bytes:
            raise TransferError(
                f"view of blocks [{first}, {first + length}) has {view.nbytes} bytes, layout "
                f"says {length * self.block_bytes}",
                reason=TransferFailure.INTERNAL,
            )
        return view


def chunk_pieces(views: BlockViews, offset: int, size: int) -> list[bytes | memoryview]:
    """Views of the ``size`` bytes at ``offset`` of the concatenation of ``views`` (no copy):
    one per run of consecutive blocks."""
    pieces: list[bytes | memoryview] = []
    while size > 0:
        piece = views.span(offset)[:size]
        pieces.append(piece)
        offset += piece.nbytes
        size -= piece.nbytes
    return pieces


def to_chunk_data(
    offset_bytes: int,
    total_bytes: int,
    algorithm: ChecksumAlgorithm,
    checksum_value: int,
    pieces: Sequence[bytes | memoryview],
) -> ChunkData:
    """An encoder for in-process pulls: the pieces joined into one ``bytes`` (one copy)."""
    return ChunkData(offset_bytes, total_bytes, algorithm, checksum_value, b"".join(pieces))


class ChunkWriter:
    """Verifies incoming chunks and writes them into preallocated destination blocks."""

    def __init__(self, store: BlockStore, dst_block_ids: Sequence[int]) -> None:
        self._block_bytes = store.layout.block_bytes
        self._views = BlockViews(store, dst_block_ids)
        self._dst_block_ids = tuple(dst_block_ids)
        self.total_bytes = len(self._views) * self._block_bytes
        self.bytes_done = 0

    def prepare(self) -> None:
        """Fetch every destination view now; call it while the first chunk is on its way."""
        self._views.fetch_all()

    def take(self, chunk: ChunkLike) -> None:
        """:meth:`write` one chunk of a stream."""
        self.write(
            chunk.offset_bytes,
            chunk.total_bytes,
            chunk.checksum_algorithm,
            chunk.checksum,
            chunk.payload,
        )

    def write(
        self,
        offset_bytes: int,
        total_bytes: int,
        algorithm: int,
        checksum_value: int,
        payload: Payload,
    ) -> None:
        """Check one chunk and copy it into place; raise ``TransferError`` if it is wrong.

        ``algorithm`` is the chunk's ``ChecksumAlgorithm`` number (an unknown one is a bad
        chunk) and ``checksum_value`` its checksum of ``payload`` (of its pieces in order).
        """
        pieces = list(payload) if isinstance(payload, tuple) else [memoryview(payload)]
        size = sum(piece.nbytes for piece in pieces)
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
        if checksum_pieces(algorithm, pieces) != checksum_value:
            raise TransferError(
                f"chunk at offset {offset_bytes} fails its {_name(algorithm)} check",
                reason=TransferFailure.CORRUPT_CHUNK,
            )
        offset = offset_bytes
        for source in pieces:
            self._place(offset, source)
            offset += source.nbytes
        self.bytes_done += size

    def _place(self, offset_bytes: int, source: memoryview) -> None:
        """Copy verified bytes to ``offset_bytes`` of the destination blocks."""
        done, size = 0, source.nbytes
        while done < size:
            target = self._views.span(offset_bytes + done)
            take = min(target.nbytes, size - done)
            target[:take] = source[done : done + take]
            done += take

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


def _name(algorithm: int) -> str:
    return ChecksumAlgorithm(algorithm).name  # known: checksum() accepted it
