"""The disk tier: KV blocks as checksummed files in a directory this engine holds a lock on.

Each engine claims a free ``engine-<n>`` sub-directory of the configured path with an
exclusive ``flock`` (released by the kernel when the process dies), so engines sharing a node and
a path never touch each other's files. It tries the free directories most recently written
first, so an engine restarted on the same node claims the directory its predecessor (the
engine that just died) left rather than an older one; :meth:`DiskTier.open` re-indexes the
files found there (newest kept when they exceed the capacity), so warm sessions survive the
restart. Files written with
another KV layout are ignored with a logged reason.

Bookkeeping (which hashes are here, LRU, pins) runs on the engine thread; the file reads, writes
and deletes run on the tiers' I/O thread, in submission order (see :mod:`engine.kv.tiers.io`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import BinaryIO

from core.errors import ConfigError
from core.hashing import BlockHash
from core.kv_events import KVMedium
from engine.kv.tiers.block_file import (
    HEADER_BYTES,
    SUFFIX,
    BlockFileError,
    check_header,
    file_name,
    read_block_file,
    read_header,
    write_block_file,
)
from engine.kv.tiers.entries import TierEntries

logger = logging.getLogger(__name__)

MAX_ENGINE_DIRS = 256


class DiskTier:
    """Up to ``capacity`` block files in this engine's directory."""

    medium: KVMedium = "disk"

    def __init__(
        self, directory: Path, lock: BinaryIO, fingerprint: str, block_bytes: int, capacity: int
    ) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.block_bytes = block_bytes
        self.entries = TierEntries(capacity)
        self._lock = lock
        self.ignored_files = 0

    @classmethod
    def open(
        cls, root: str, fingerprint: str, block_bytes: int, capacity_bytes: int, now_s: float
    ) -> DiskTier:
        """Claim a directory under ``root`` and index the valid block files already in it."""
        capacity = capacity_bytes // (block_bytes + HEADER_BYTES)
        if capacity < 1:
            raise ConfigError(
                f"kv_tiers.disk.bytes={capacity_bytes} holds no block of "
                f"{block_bytes + HEADER_BYTES} bytes",
                param="kv_tiers.disk.bytes",
            )
        base = Path(root)
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"cannot create the disk KV tier at {root}: {e}", param="kv_tiers.disk.path"
            ) from e
        directory, lock = _claim(base)
        tier = cls(directory, lock, fingerprint, block_bytes, capacity)
        tier._reindex(now_s)
        return tier

    def close(self) -> None:
        """Release the directory lock (the files stay for the next engine)."""
        if not self._lock.closed:
            self._lock.close()

    def path_of(self, block_hash: BlockHash) -> Path:
        """Where ``block_hash`` is (or will be) stored."""
        return self.directory / file_name(block_hash)

    # -- file operations (I/O thread) ---------------------------------------------------------

    def write(self, block_hash: BlockHash, payload: bytes) -> None:
        """Write one block file (atomically)."""
        write_block_file(self.path_of(block_hash), self.fingerprint, block_hash, payload)

    def read(self, block_hash: BlockHash) -> bytes:
        """A verified payload; raises ``BlockFileError`` or ``OSError`` when unusable."""
        return read_block_file(
            self.path_of(block_hash), self.fingerprint, block_hash, self.block_bytes
        )

    def delete(self, block_hash: BlockHash) -> None:
        """Remove a block file (missing is fine)."""
        self.path_of(block_hash).unlink(missing_ok=True)

    # -- warm restart -------------------------------------------------------------------------

    def _reindex(self, now_s: float) -> None:
        found: list[tuple[float, BlockHash]] = []
        reasons: dict[str, int] = {}
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                with open(path, "rb") as f:
                    header = read_header(f.read(HEADER_BYTES))
                block_hash = int(path.stem, 16)
                check_header(header, self.fingerprint, block_hash, self.block_bytes)
                found.append((path.stat().st_mtime, block_hash))
            except (BlockFileError, OSError, ValueError) as e:
                reason = str(e).split(",")[0]
                reasons[reason] = reasons.get(reason, 0) + 1
        self.ignored_files = sum(reasons.values())
        for reason, count in reasons.items():
            logger.warning("disk KV tier %s: ignored %d file(s): %s", self.directory, count, reason)
        found.sort()
        keep = found[-self.entries.capacity :]
        for _, block_hash in found[: len(found) - len(keep)]:
            self.delete(block_hash)
        for _, block_hash in keep:
            self.entries.add(block_hash, 0, now_s)
        if keep:
            logger.info("disk KV tier %s: %d blocks re-indexed", self.directory, len(keep))


def _claim(base: Path) -> tuple[Path, BinaryIO]:
    for index in _claim_order(base):
        directory = base / f"engine-{index}"
        lock = open(base / f"engine-{index}.lock", "wb")  # noqa: SIM115 - held for the tier's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        directory.mkdir(exist_ok=True)
        for stale in directory.glob(".*.tmp"):
            stale.unlink(missing_ok=True)  # a predecessor died mid-write
        os.utime(directory)
        return directory, lock
    raise ConfigError(
        f"all {MAX_ENGINE_DIRS} disk KV tier directories under {base} are in use",
        param="kv_tiers.disk.path",
    )


def _claim_order(base: Path) -> list[int]:
    """Directory indices to try: existing ones most recently written first (a replica that
    just died is the likeliest predecessor of the one starting now), then the rest in order."""
    existing: list[tuple[float, int]] = []
    for index in range(MAX_ENGINE_DIRS):
        try:
            existing.append((-(base / f"engine-{index}").stat().st_mtime, index))
        except FileNotFoundError:
            continue
    first = [index for _, index in sorted(existing)]
    tried = set(first)
    return first + [i for i in range(MAX_ENGINE_DIRS) if i not in tried]
