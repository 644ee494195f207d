"""The chunk codec and writer: wire compatibility with protobuf, verification, exact placement."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from core.errors import TransferError
from core.kv_handle import TransferFailure
from transfer import NumpyBlockStore
from transfer.chunks import ChunkWriter, checksum, checksum_pieces, chunk_pieces, plan_chunks
from transfer.codec import ChunkDecodeError, decode_chunk, encode_chunk
from transfer.faults import FaultInjection
from transfer.proto._generated import kv_transfer_pb2 as pb

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("offset", "total", "payload"),
    [(0, 0, b""), (0, 5, b"hello"), (1 << 40, (1 << 40) + 3, b"\x00\xff\x7f"), (300, 301, b"x")],
)
def test_encoding_is_byte_identical_to_protobuf(offset: int, total: int, payload: bytes) -> None:
    crc = checksum(payload)
    ours = encode_chunk(offset, total, crc, [payload[:1], payload[1:]])
    reference = pb.Chunk(
        offset_bytes=offset, total_bytes=total, crc32=crc, payload=payload
    ).SerializeToString()
    assert ours == reference
    decoded = decode_chunk(reference)
    assert (decoded.offset_bytes, decoded.total_bytes, decoded.crc32) == (offset, total, crc)
    assert bytes(decoded.payload) == payload


def test_decoder_accepts_any_field_order_and_skips_unknown_fields() -> None:
    # payload first, an unknown varint field 9 and an unknown bytes field 10, then the rest.
    wire = (
        b"\x22\x03abc"
        + b"\x48\x96\x01"
        + b"\x52\x02zz"
        + b"\x1d"
        + checksum(b"abc").to_bytes(4, "little")
        + b"\x08\x07\x10\x0a"
    )
    chunk = decode_chunk(wire)
    assert (chunk.offset_bytes, chunk.total_bytes, bytes(chunk.payload)) == (7, 10, b"abc")
    assert chunk.crc32 == checksum(b"abc")


@pytest.mark.parametrize("wire", [b"\x22\x05ab", b"\x08\xff", b"\x1d\x01\x02", b"\x0b"])
def test_decoder_rejects_truncated_or_invalid_bytes(wire: bytes) -> None:
    with pytest.raises(ChunkDecodeError):
        decode_chunk(wire)


def test_plan_cuts_the_stream_into_bounded_chunks() -> None:
    assert list(plan_chunks(10, 4)) == [(0, 4), (4, 4), (8, 2)]
    assert list(plan_chunks(8, 4)) == [(0, 4), (4, 4)]
    assert list(plan_chunks(0, 4)) == []


def test_pieces_span_block_boundaries_and_checksum_matches_the_joined_bytes(
    make_store: Callable[..., NumpyBlockStore],
) -> None:
    store = make_store(4, seed=1)
    block_bytes = store.layout.block_bytes
    views = [memoryview(store.data[i]) for i in (3, 0, 2)]
    pieces = chunk_pieces(views, block_bytes, block_bytes - 10, block_bytes + 20)
    joined = b"".join(pieces)
    expected = np.concatenate([store.data[3, -10:], store.data[0], store.data[2, :10]]).tobytes()
    assert joined == expected
    assert [len(p) for p in pieces] == [10, block_bytes, 10]
    assert checksum_pieces(pieces) == checksum(expected)


def test_writer_places_verified_bytes_and_reports_unwritten_blocks(
    make_store: Callable[..., NumpyBlockStore],
) -> None:
    source = make_store(3, seed=2)
    dest = make_store(5)
    stream = source.data.tobytes()
    writer = ChunkWriter(dest, [4, 1, 2])
    half = len(stream) // 2  # ends in the middle of the second block
    writer.write(0, len(stream), checksum(stream[:half]), stream[:half])
    assert writer.invalid_block_ids() == (1, 2)
    writer.write(half, len(stream), checksum(stream[half:]), memoryview(stream)[half:])
    writer.finish()
    assert writer.invalid_block_ids() == ()
    np.testing.assert_array_equal(dest.data[[4, 1, 2]], source.data)
    assert not dest.data[[0, 3]].any()


@pytest.mark.parametrize(
    ("offset", "total", "size", "crc_ok", "reason"),
    [
        (1, None, 8, True, TransferFailure.BAD_CHUNK),  # not where the stream left off
        (0, 99, 8, True, TransferFailure.BAD_CHUNK),  # wrong stream size
        (0, None, 0, True, TransferFailure.BAD_CHUNK),  # empty chunk
        (0, None, None, True, TransferFailure.BAD_CHUNK),  # overruns the stream
        (0, None, 8, False, TransferFailure.CORRUPT_CHUNK),
    ],
)
def test_writer_rejects_bad_chunks_without_touching_the_blocks(
    make_store: Callable[..., NumpyBlockStore],
    offset: int,
    total: int | None,
    size: int | None,
    crc_ok: bool,
    reason: TransferFailure,
) -> None:
    dest = make_store(2)
    writer = ChunkWriter(dest, [0, 1])
    payload = b"\x01" * (writer.total_bytes + 1 if size is None else size)
    crc = checksum(payload) if crc_ok else checksum(payload) ^ 1
    with pytest.raises(TransferError) as info:
        writer.write(offset, writer.total_bytes if total is None else total, crc, payload)
    assert info.value.reason == reason
    assert not dest.data.any()
    assert writer.invalid_block_ids() == (0, 1)


def test_writer_finish_rejects_a_short_stream(make_store: Callable[..., NumpyBlockStore]) -> None:
    writer = ChunkWriter(make_store(1), [0])
    with pytest.raises(TransferError) as info:
        writer.finish()
    assert info.value.reason == TransferFailure.BAD_CHUNK


def test_fault_injection_corrupts_only_the_chosen_chunk() -> None:
    faults = FaultInjection(corrupt_chunk_seq=1)
    pieces: list[bytes | memoryview] = [b"\x10\x20", memoryview(b"\x30")]
    assert faults.corrupt(0, pieces) is pieces
    assert b"".join(faults.corrupt(1, pieces)) == b"\xef\x20\x30"
    assert faults.should_fail(3) is False
    assert FaultInjection(fail_after_chunks=2).should_fail(2) is True
    assert FaultInjection().active is False
    with pytest.raises(ValueError, match="delay_per_chunk_s"):
        FaultInjection(delay_per_chunk_s=-1.0)
