"""Chunk checksums: the algorithms a pull may use, how peers agree on one, and computing them.

Every chunk carries a checksum of its payload, verified by the importer before the bytes reach a
destination block. Two algorithms exist (``pdserve.kv.v1.ChecksumAlgorithm``):

* ``CRC32`` — zlib CRC-32, the v1 baseline every peer implements. About 1-1.5 GB/s here, which
  cost a pull ~20% of its throughput.
* ``XXH3_64`` — XXH3 64-bit from the ``xxhash`` library, >20 GB/s, preferred.

The importer offers :data:`ACCEPTED_CHECKSUMS` (best first) in its ``PullRequest``; the exporter
picks with :func:`negotiate` and names the choice in every chunk. A peer that predates the
negotiation sends no list and no algorithm; both absences mean CRC-32, so mixed versions
interoperate.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Sequence

import xxhash

from core.errors import TransferError
from core.kv_handle import TransferFailure

Buffer = bytes | memoryview


class ChecksumAlgorithm(enum.IntEnum):
    """How a chunk's payload is checksummed; values are ``pdserve.kv.v1.ChecksumAlgorithm``'s."""

    CRC32 = 0
    XXH3_64 = 1


ACCEPTED_CHECKSUMS: tuple[ChecksumAlgorithm, ...] = (
    ChecksumAlgorithm.XXH3_64,
    ChecksumAlgorithm.CRC32,
)
"""What this build verifies, best first: what an importer offers by default."""

_KNOWN = frozenset(int(a) for a in ChecksumAlgorithm)


def negotiate(accepted: Sequence[int]) -> ChecksumAlgorithm:
    """The exporter's choice: the first of the importer's ``accepted`` that this build knows.

    An empty list (a v1 importer), or one naming only algorithms unknown here, gets CRC-32: the
    baseline every peer verifies.
    """
    for number in accepted:
        if number in _KNOWN:
            return ChecksumAlgorithm(number)
    return ChecksumAlgorithm.CRC32


def checksum_pieces(algorithm: int, pieces: Sequence[Buffer]) -> int:
    """The ``algorithm`` checksum of the concatenation of ``pieces`` (an unsigned int)."""
    if algorithm == ChecksumAlgorithm.XXH3_64:
        if len(pieces) == 1:
            return xxhash.xxh3_64_intdigest(pieces[0])
        state = xxhash.xxh3_64()
        for piece in pieces:
            state.update(piece)
        return state.intdigest()
    if algorithm == ChecksumAlgorithm.CRC32:
        crc = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
        return crc & 0xFFFFFFFF
    raise TransferError(f"unknown checksum algorithm {algorithm}", reason=TransferFailure.BAD_CHUNK)


def checksum(algorithm: int, data: Buffer) -> int:
    """The ``algorithm`` checksum of ``data``; ``TransferError(bad_chunk)`` if it is unknown."""
    return checksum_pieces(algorithm, (data,))
