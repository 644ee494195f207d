"""The disk tier's file format: one KV block per file, self-describing and checksummed.

``header | payload``: the header is ``magic, version, layout fingerprint, block hash, payload
length, XXH3-64 of the payload`` (little endian). A file whose magic, version, fingerprint, hash,
length or checksum disagrees with what the reader expects is rejected with the reason, so a torn
write, a flipped byte or a file from another model or block size is a cache miss, never KV.
Files are written to a temporary name and renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import xxhash

from core.hashing import BlockHash

MAGIC = b"PDKV"
VERSION = 1
_HEADER = struct.Struct("<4sH16sQQQ")
HEADER_BYTES = _HEADER.size
SUFFIX = ".kvb"


class BlockFileError(Exception):
    """A block file that must not be used; the message says why."""


@dataclass(frozen=True)
class BlockFileHeader:
    """What a block file says about itself."""

    fingerprint: str
    block_hash: BlockHash
    payload_bytes: int
    checksum: int


def file_name(block_hash: BlockHash) -> str:
    """``<hash as 16 hex digits>.kvb``."""
    return f"{block_hash:016x}{SUFFIX}"


def write_block_file(path: Path, fingerprint: str, block_hash: BlockHash, payload: bytes) -> None:
    """Write ``payload`` as a block file at ``path`` atomically (temp file, then rename)."""
    checksum = xxhash.xxh3_64_intdigest(payload)
    header = _HEADER.pack(
        MAGIC, VERSION, fingerprint.encode().ljust(16, b"\0"), block_hash, len(payload), checksum
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(payload)
    os.replace(tmp, path)


def read_header(data: bytes) -> BlockFileHeader:
    """Parse a header; raises :class:`BlockFileError` on a short or foreign file."""
    if len(data) < HEADER_BYTES:
        raise BlockFileError(f"{len(data)} bytes is shorter than a block file header")
    magic, version, fingerprint, block_hash, payload_bytes, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BlockFileError(f"not a pdserve KV block file (magic {magic!r})")
    if version != VERSION:
        raise BlockFileError(f"block file version {version}, this engine reads {VERSION}")
    return BlockFileHeader(
        fingerprint.rstrip(b"\0").decode(errors="replace"), block_hash, payload_bytes, checksum
    )


def check_header(
    header: BlockFileHeader, fingerprint: str, block_hash: BlockHash, payload_bytes: int
) -> None:
    """Raise :class:`BlockFileError` unless the header is for this layout, hash and size."""
    if header.fingerprint != fingerprint:
        raise BlockFileError(
            f"written with KV layout {header.fingerprint}, this engine's is {fingerprint}"
        )
    if header.block_hash != block_hash:
        raise BlockFileError(f"holds block {header.block_hash:#x}, expected {block_hash:#x}")
    if header.payload_bytes != payload_bytes:
        raise BlockFileError(f"holds {header.payload_bytes} bytes, a block is {payload_bytes}")


def read_block_file(
    path: Path, fingerprint: str, block_hash: BlockHash, payload_bytes: int
) -> bytes:
    """The verified payload of a block file; raises :class:`BlockFileError` (or ``OSError``)."""
    data = path.read_bytes()
    header = read_header(data)
    check_header(header, fingerprint, block_hash, payload_bytes)
    payload = data[HEADER_BYTES:]
    if len(payload) != payload_bytes:
        raise BlockFileError(f"truncated: {len(payload)} of {payload_bytes} payload bytes")
    if xxhash.xxh3_64_intdigest(payload) != header.checksum:
        raise BlockFileError("checksum mismatch: the payload changed after it was written")
    return payload
