"""The chunk codec and writer: wire compatibility with protobuf, verification, exact placement."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from core.errors import TransferError
from core.kv_handle import TransferFailure
from transfer import NumpyBlockStore
from transfer.checksums import ChecksumAlgorithm, checksum, checksum_pieces
from transfer.chunk_wire import ChunkDecodeError, decode_chunk, encode_chunk
from transfer.chunks import BlockViews, ChunkWriter, chunk_pieces, plan_chunks, pull_chunk_bytes
from transfer.faults import FaultInjection
from transfer.proto._generated import kv_transfer_pb2 as pb

pytestmark = pytest.mark.timeout(30)


ALGORITHMS = list(ChecksumAlgorithm)
MIB = 1 << 20


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    ("offset", "total", "payload"),
    [(0, 0, b""), (0, 5, b"hello"), (1 << 40, (1 << 40) + 3, b"\x00\xff\x7f"), (300, 301, b"x")],
)
def test_encoding_is_byte_identical_to_protobuf(
    algorithm: ChecksumAlgorithm, offset: int, total: int, payload: bytes
) -> None:
    digest = checksum(algorithm, payload)
    ours = encode_chunk(offset, total, algorithm, digest, [payload[:1], payload[1:]])
    fields: dict[str, object] = {"crc32": digest} if algorithm == 0 else {"checksum64": digest}
    reference = pb.Chunk(
        offset_bytes=offset,
        total_bytes=total,
        payload=payload,
        checksum_algorithm=int(algorithm),  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    ).SerializeToString()
    assert ours == reference
    decoded = decode_chunk(reference)
    assert (decoded.offset_bytes, decoded.total_bytes) == (offset, total)
    assert (decoded.checksum_algorithm, decoded.checksum) == (algorithm, digest)
    assert bytes(decoded.payload) == payload


def test_a_v1_chunk_without_an_algorithm_reads_as_crc32() -> None:
    crc = checksum(ChecksumAlgorithm.CRC32, b"kv")
    wire = b"\x10\x02\x1d" + crc.to_bytes(4, "little") + b"\x22\x02kv"  # fields 2, 3, 4 only
    chunk = decode_chunk(wire)
    assert (chunk.checksum_algorithm, chunk.checksum) == (ChecksumAlgorithm.CRC32, crc)
    assert pb.Chunk.FromString(wire).checksum_algorithm == pb.CHECKSUM_ALGORITHM_CRC32


def test_decoder_accepts_any_field_order_and_skips_unknown_fields() -> None:
    digest = checksum(ChecksumAlgorithm.XXH3_64, b"abc")
    # algorithm and checksum64 first, then payload, an unknown varint field 9, an unknown
    # bytes field 10, a stray crc32 that XXH3 chunks ignore, then offset and total.
    wire = (
        b"\x28\x01"
        + b"\x31"
        + digest.to_bytes(8, "little")
        + b"\x22\x03abc"
        + b"\x48\x96\x01"
        + b"\x52\x02zz"
        + b"\x1d\x01\x02\x03\x04"
        + b"\x08\x07\x10\x0a"
    )
    chunk = decode_chunk(wire)
    assert (chunk.offset_bytes, chunk.total_bytes, bytes(chunk.payload)) == (7, 10, b"abc")
    assert (chunk.checksum_algorithm, chunk.checksum) == (ChecksumAlgorithm.XXH3_64, digest)


def test_decoded_payload_aliases_the_received_buffer() -> None:
    wire = encode_chunk(0, 3, ChecksumAlgorithm.XXH3_64, 1, [b"abc"])
    chunk = decode_chunk(wire)
    assert chunk.payload.obj is wire  # a view: no copy on the receive path


@pytest.mark.parametrize(
    "wire", [b"\x22\x05ab", b"\x08\xff", b"\x1d\x01\x02", b"\x31\x01\x02\x03", b"\x0b"]
)
def test_decoder_rejects_truncated_or_invalid_bytes(wire: bytes) -> None:
    with pytest.raises(ChunkDecodeError):
        decode_chunk(wire)


def test_plan_cuts_the_stream_into_bounded_chunks() -> None:
    assert list(plan_chunks(10, 4)) == [(0, 4), (4, 4), (8, 2)]
    assert list(plan_chunks(8, 4)) == [(0, 4), (4, 4)]
    assert list(plan_chunks(0, 4)) == []


@pytest.mark.parametrize(
    ("total_mib", "config_mib", "expected_bytes"),
    [
        (256, 2, 2 * MIB),  # bulk pulls use the configured chunk
        (16, 2, 2 * MIB),  # eight configured chunks or more
        (8, 2, MIB),  # one 4K-token prompt of tiny-llama: eight 1 MiB chunks
        (12, 4, 1536 * 1024),  # in between: eight chunks, 64 KiB-aligned
        (0.5, 2, MIB),  # never below 1 MiB (the pull is a single chunk anyway)
        (8, 0.25, MIB // 4),  # never above the configured size
    ],
)
def test_small_pulls_get_smaller_chunks(
    total_mib: float, config_mib: float, expected_bytes: int
) -> None:
    assert pull_chunk_bytes(int(total_mib * MIB), int(config_mib * MIB)) == expected_bytes
    assert pull_chunk_bytes(12 * MIB + 1, 4 * MIB) % (64 * 1024) == 0


class CountingStore:
    """A block store that counts ``blocks_view`` calls (by first block)."""

    def __init__(self, store: NumpyBlockStore, view_bytes: int | None = None) -> None:
        self.layout, self.num_blocks = store.layout, store.num_blocks
        self._store = store
        self._view_bytes = view_bytes
        self.calls: list[int] = []

    def blocks_view(self, first_block_id: int, num_blocks: int) -> memoryview:
        self.calls.append(first_block_id)
        return self._store.blocks_view(first_block_id, num_blocks)[: self._view_bytes]


def test_pieces_span_block_boundaries_and_views_are_fetched_on_first_use(
    make_store: Callable[..., NumpyBlockStore],
) -> None:
    store = make_store(4, seed=1)
    counting = CountingStore(store)
    views = BlockViews(counting, [3, 0, 2, 1])
    assert counting.calls == []
    block_bytes = store.layout.block_bytes
    pieces = chunk_pieces(views, block_bytes - 10, block_bytes + 20)
    joined = b"".join(pieces)
    expected = np.concatenate([store.data[3, -10:], store.data[0], store.data[2, :10]]).tobytes()
    assert joined == expected
    assert [len(p) for p in pieces] == [10, block_bytes, 10]
    for algorithm in ChecksumAlgorithm:
        assert checksum_pieces(algorithm, pieces) == checksum(algorithm, expected)
    chunk_pieces(views, 0, 10)
    assert counting.calls == [3, 0, 2]  # once each, block 1 not yet
    views.fetch_all()
    assert counting.calls == [3, 0, 2, 1]


def test_a_view_of_the_wrong_size_is_an_internal_error(
    make_store: Callable[..., NumpyBlockStore],
) -> None:
    store = make_store(2)
    writer = ChunkWriter(CountingStore(store, view_bytes=100), [0, 1])
    with pytest.raises(TransferError) as info:
        writer.prepare()
    assert info.value.reason == TransferFailure.INTERNAL


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_writer_places_verified_bytes_and_reports_unwritten_blocks(
    make_store: Callable[..., NumpyBlockStore], algorithm: ChecksumAlgorithm
) -> None:
    source = make_store(3, seed=2)
    dest = make_store(5)
    stream = source.data.tobytes()
    writer = ChunkWriter(dest, [4, 1, 2])
    half = len(stream) // 2  # ends in the middle of the second block
    writer.write(0, len(stream), algorithm, checksum(algorithm, stream[:half]), stream[:half])
    assert writer.invalid_block_ids() == (1, 2)
    second = memoryview(stream)[half:]
    writer.write(half, len(stream), algorithm, checksum(algorithm, second), second)
    writer.finish()
    assert writer.invalid_block_ids() == ()
    np.testing.assert_array_equal(dest.data[[4, 1, 2]], source.data)
    assert not dest.data[[0, 3]].any()


@pytest.mark.parametrize(
    ("offset", "total", "size", "algorithm", "sum_ok", "reason"),
    [
        (1, None, 8, 1, True, TransferFailure.BAD_CHUNK),  # not where the stream left off
        (0, 99, 8, 1, True, TransferFailure.BAD_CHUNK),  # wrong stream size
        (0, None, 0, 1, True, TransferFailure.BAD_CHUNK),  # empty chunk
        (0, None, None, 1, True, TransferFailure.BAD_CHUNK),  # overruns the stream
        (0, None, 8, 7, True, TransferFailure.BAD_CHUNK),  # unknown checksum algorithm
        (0, None, 8, 0, False, TransferFailure.CORRUPT_CHUNK),
        (0, None, 8, 1, False, TransferFailure.CORRUPT_CHUNK),
    ],
)
def test_writer_rejects_bad_chunks_without_touching_the_blocks(
    make_store: Callable[..., NumpyBlockStore],
    offset: int,
    total: int | None,
    size: int | None,
    algorithm: int,
    sum_ok: bool,
    reason: TransferFailure,
) -> None:
    dest = make_store(2)
    writer = ChunkWriter(dest, [0, 1])
    payload = b"\x01" * (writer.total_bytes + 1 if size is None else size)
    digest = checksum(min(algorithm, 1), payload) ^ (0 if sum_ok else 1)
    total_bytes = writer.total_bytes if total is None else total
    with pytest.raises(TransferError) as info:
        writer.write(offset, total_bytes, algorithm, digest, payload)
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
