"""Chunk checksums: the enum matches the proto, negotiation with old and new peers, answers."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import grpc
import numpy as np
import pytest
import xxhash

from core.config import TransferConfig
from core.errors import TransferError
from core.kv_handle import TransferFailure, TransferState
from transfer import FaultInjection, KVExportServer, KVImportClient, NumpyBlockStore
from transfer.checksums import (
    ACCEPTED_CHECKSUMS,
    ChecksumAlgorithm,
    checksum,
    checksum_pieces,
    negotiate,
)
from transfer.device_path import NO_CHECKSUM
from transfer.proto._generated import kv_transfer_pb2 as pb
from transfer.rpc import KVTransferClientMethods

pytestmark = pytest.mark.timeout(30)

XXH3 = ChecksumAlgorithm.XXH3_64
CRC32 = ChecksumAlgorithm.CRC32
METADATA = (("authorization", "Bearer unit-test-token"),)


def test_enum_mirrors_the_proto_enum() -> None:
    proto = {
        name.removeprefix("CHECKSUM_ALGORITHM_"): number
        for name, number in pb.ChecksumAlgorithm.items()
    }
    # NONE marks device-path location chunks (transfer.device_path), never a payload checksum
    assert proto == {a.name: a.value for a in ChecksumAlgorithm} | {"NONE": NO_CHECKSUM}
    assert CRC32 == 0  # a v1 chunk with no algorithm field is a CRC-32 chunk


@pytest.mark.parametrize(
    ("accepted", "chosen"),
    [
        ([], CRC32),  # a v1 importer offers nothing
        ([XXH3, CRC32], XXH3),
        ([CRC32, XXH3], CRC32),  # the importer's order wins
        ([99], CRC32),  # only algorithms unknown here: the baseline
        ([99, 1], XXH3),
    ],
)
def test_negotiation_takes_the_first_known_offer(accepted: list[int], chosen: int) -> None:
    assert negotiate(accepted) == chosen
    assert type(negotiate(accepted)) is ChecksumAlgorithm


def test_the_default_offer_prefers_xxh3_and_keeps_the_crc32_baseline() -> None:
    assert ACCEPTED_CHECKSUMS[0] == XXH3 and CRC32 in ACCEPTED_CHECKSUMS


def test_known_answers() -> None:
    assert checksum(CRC32, b"123456789") == 0xCBF43926  # the CRC-32 check value
    assert checksum(XXH3, b"") == 0x2D06800538D394C2  # XXH3_64bits of no input, seed 0


@pytest.mark.parametrize("algorithm", list(ChecksumAlgorithm))
def test_pieces_checksum_as_their_concatenation(algorithm: ChecksumAlgorithm) -> None:
    data = bytes(range(256)) * 300
    view = memoryview(data)
    splits = [[view], [view[:1], view[1:]], [view[:0], view[:100], view[100:70000], view[70000:]]]
    whole = checksum(algorithm, data)
    assert all(checksum_pieces(algorithm, pieces) == whole for pieces in splits)
    flipped = bytearray(data)
    flipped[12345] ^= 0x10
    assert checksum(algorithm, bytes(flipped)) != whole


def test_an_unknown_algorithm_is_a_bad_chunk() -> None:
    with pytest.raises(TransferError) as info:
        checksum(7, b"abc")
    assert info.value.reason == TransferFailure.BAD_CHUNK


@pytest.mark.parametrize(
    ("offer", "algorithm"), [([], CRC32), ([XXH3, CRC32], XXH3), ([CRC32, XXH3], CRC32)]
)
def test_the_exporter_answers_each_offer_with_chunks_protobuf_can_verify(
    offer: list[ChecksumAlgorithm],
    algorithm: ChecksumAlgorithm,
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
) -> None:
    source = make_store(80, seed=12)  # 1.25 MiB: two 1 MiB chunks
    server = make_server(source, config)
    handle = server.export(range(80))
    request = pb.PullRequest(
        transfer_id=handle.transfer_id,
        layout_fingerprint=handle.layout_fingerprint,
        exporter_epoch=handle.exporter_epoch,
        accepted_checksums=[int(a) for a in offer],  # type: ignore[misc]
    )
    with grpc.insecure_channel(server.address) as channel:
        messages = KVTransferClientMethods(channel).pull(request, metadata=METADATA, timeout=10)
        chunks = [pb.Chunk.FromString(m) for m in messages]  # the generated parser, not ours
    assert [c.checksum_algorithm for c in chunks] == [algorithm, algorithm]
    for chunk in chunks:  # checked against the libraries directly
        if algorithm == CRC32:
            assert (chunk.crc32, chunk.checksum64) == (zlib.crc32(chunk.payload), 0)
        else:
            assert (chunk.crc32, chunk.checksum64) == (0, xxhash.xxh3_64_intdigest(chunk.payload))
    assert b"".join(c.payload for c in chunks) == source.data.tobytes()


@pytest.mark.parametrize("offer", [(XXH3, CRC32), (CRC32,)])
def test_each_algorithm_pulls_bit_exact_and_catches_a_corrupt_chunk(
    offer: tuple[ChecksumAlgorithm, ...],
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
) -> None:
    source, dest = make_store(80, seed=13), make_store(80)
    server = make_server(source, config)
    client = make_client(dest, config, accepted_checksums=offer)
    client.pull(server.export(range(80)), range(80)).result(timeout_s=10)
    np.testing.assert_array_equal(dest.data, source.data)
    dest.data[:] = 0
    server.set_faults(FaultInjection(corrupt_chunk_seq=1))
    status = client.pull(server.export(range(80)), range(80)).wait(timeout_s=10)
    assert status.state is TransferState.FAILED and status.reason == TransferFailure.CORRUPT_CHUNK
    assert status.invalid_block_ids == tuple(range(64, 80))  # chunk 0 (64 blocks) was good
    assert not dest.data[64:].any()
