"""Protobuf wire encoding of the hot ``pdserve.kv.v1.Chunk`` message, without extra copies.

Going through the generated class costs two extra copies of every payload on each side (into
the message, then into the serialized string; out of the string, then out of the message). For
``Chunk`` alone we write and read the protobuf wire format directly: the exporter joins a short
header and the block slices into the serialized message in one copy, and the importer reads the
payload as a ``memoryview`` into the received buffer. The bytes on the wire are exactly what
``kv_transfer_pb2.Chunk.SerializeToString`` produces (zero fields omitted, fields in number
order: fields 1-3, the payload, then the checksum algorithm and 64-bit checksum after it), and
:func:`decode_chunk` accepts any valid encoding (any field order, unknown fields skipped), so
other protobuf clients interoperate; the tests check both directions. The checksum travels in
``crc32`` for CRC-32 and in ``checksum64`` otherwise (``transfer.checksums``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
# Field numbers of Chunk in kv_transfer.proto.
_OFFSET, _TOTAL, _CRC, _PAYLOAD, _ALGORITHM, _CHECKSUM64 = 1, 2, 3, 4, 5, 6
_FIXED32_STRUCT = struct.Struct("<I")
_FIXED64_STRUCT = struct.Struct("<Q")


class ChunkDecodeError(ValueError):
    """The bytes are not a valid ``Chunk`` encoding."""


@dataclass(frozen=True, slots=True)
class ChunkView:
    """A decoded ``Chunk`` whose payload aliases the received buffer."""

    offset_bytes: int
    total_bytes: int
    checksum_algorithm: int
    checksum: int
    payload: memoryview


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_chunk(
    offset_bytes: int,
    total_bytes: int,
    algorithm: int,
    checksum_value: int,
    pieces: Sequence[bytes | memoryview],
) -> bytes:
    """The serialized ``Chunk`` whose payload is the concatenation of ``pieces`` (one copy)."""
    payload_bytes = sum(len(p) for p in pieces)
    header = bytearray()
    if offset_bytes:
        header += _varint(_OFFSET << 3 | _VARINT) + _varint(offset_bytes)
    if total_bytes:
        header += _varint(_TOTAL << 3 | _VARINT) + _varint(total_bytes)
    if algorithm == 0 and checksum_value:  # CRC-32
        header += _varint(_CRC << 3 | _FIXED32) + _FIXED32_STRUCT.pack(checksum_value)
    if payload_bytes:
        header += _varint(_PAYLOAD << 3 | _LEN) + _varint(payload_bytes)
    trailer = bytearray()
    if algorithm:
        trailer += _varint(_ALGORITHM << 3 | _VARINT) + _varint(algorithm)
        if checksum_value:
            trailer += _varint(_CHECKSUM64 << 3 | _FIXED64) + _FIXED64_STRUCT.pack(checksum_value)
    return b"".join([header, *pieces, trailer])


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ChunkDecodeError("truncated or oversized varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def decode_chunk(data: bytes) -> ChunkView:
    """Parse a serialized ``Chunk``; the payload is a view into ``data`` (no copy)."""
    view = memoryview(data)
    fields = {_OFFSET: 0, _TOTAL: 0, _CRC: 0, _ALGORITHM: 0, _CHECKSUM64: 0}
    payload = view[0:0]
    pos = 0
    while pos < len(view):
        key, pos = _read_varint(view, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = _read_varint(view, pos)
        elif wire_type == _FIXED32:
            if pos + 4 > len(view):
                raise ChunkDecodeError("truncated fixed32")
            value = _FIXED32_STRUCT.unpack_from(view, pos)[0]
            pos += 4
        elif wire_type == _FIXED64:
            if pos + 8 > len(view):
                raise ChunkDecodeError("truncated fixed64")
            value = _FIXED64_STRUCT.unpack_from(view, pos)[0]
            pos += 8
        elif wire_type == _LEN:
            size, pos = _read_varint(view, pos)
            if pos + size > len(view):
                raise ChunkDecodeError("truncated length-delimited field")
            if number == _PAYLOAD:
                payload = view[pos : pos + size]
            pos += size
            continue
        else:
            raise ChunkDecodeError(f"unsupported wire type {wire_type}")
        if number in fields:
            fields[number] = value
    if pos != len(view):
        raise ChunkDecodeError("trailing bytes after the last field")
    algorithm = fields[_ALGORITHM]
    checksum_value = fields[_CRC] if algorithm == 0 else fields[_CHECKSUM64]
    return ChunkView(fields[_OFFSET], fields[_TOTAL], algorithm, checksum_value, payload)
