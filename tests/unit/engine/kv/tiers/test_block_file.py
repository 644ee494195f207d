"""Disk block files: a round trip, and every way a file can be unusable is a typed refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.kv.tiers.block_file import (
    HEADER_BYTES,
    BlockFileError,
    read_block_file,
    write_block_file,
)

FP = "0123456789abcdef"
PAYLOAD = bytes(range(256)) * 2


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "a.kvb"
    write_block_file(path, FP, 0xDEADBEEF, PAYLOAD)
    assert read_block_file(path, FP, 0xDEADBEEF, len(PAYLOAD)) == PAYLOAD
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("offset", [HEADER_BYTES, HEADER_BYTES + 300, -1])
def test_a_flipped_payload_byte_fails_the_checksum(tmp_path: Path, offset: int) -> None:
    path = tmp_path / "a.kvb"
    write_block_file(path, FP, 7, PAYLOAD)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BlockFileError, match="checksum"):
        read_block_file(path, FP, 7, len(PAYLOAD))


@pytest.mark.parametrize(
    ("fingerprint", "block_hash", "size", "match"),
    [
        ("fedcba9876543210", 7, len(PAYLOAD), "layout"),
        (FP, 8, len(PAYLOAD), "expected"),
        (FP, 7, 64, "a block is 64"),
    ],
)
def test_a_file_for_another_layout_hash_or_size_is_refused(
    tmp_path: Path, fingerprint: str, block_hash: int, size: int, match: str
) -> None:
    path = tmp_path / "a.kvb"
    write_block_file(path, FP, 7, PAYLOAD)
    with pytest.raises(BlockFileError, match=match):
        read_block_file(path, fingerprint, block_hash, size)


def test_truncated_and_foreign_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.kvb"
    write_block_file(path, FP, 7, PAYLOAD)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(BlockFileError, match="truncated"):
        read_block_file(path, FP, 7, len(PAYLOAD))
    path.write_bytes(b"GIF89a" + bytes(100))
    with pytest.raises(BlockFileError, match="not a pdserve"):
        read_block_file(path, FP, 7, len(PAYLOAD))
    path.write_bytes(b"PD")
    with pytest.raises(BlockFileError, match="shorter"):
        read_block_file(path, FP, 7, len(PAYLOAD))
