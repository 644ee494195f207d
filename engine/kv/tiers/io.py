"""The tiers' data movers: one thread for host -> device copies, one for every disk operation.

Loads never run on the engine thread, so a request bringing its prefix back waits in a loading
state while the batch keeps stepping. Disk writes, reads and deletes share one FIFO thread, so a
read submitted after a write of the same block sees the file, and a delete never overtakes a
read. On CUDA the host -> device copies run on a side stream the copy thread synchronizes before
reporting the load done, so the engine schedules a loaded request only once its KV is in place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from core.hashing import BlockHash
from core.kv_events import KVMedium
from engine.kv.tiers.block_file import BlockFileError
from engine.kv.tiers.device_rows import DeviceRows

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadPart:
    """One block to bring back: where it comes from and which device block receives it."""

    block_hash: BlockHash
    medium: KVMedium
    dst_block_id: int
    source: Callable[[], torch.Tensor]
    """Returns the block's bytes (uint8, ``block_bytes``); raises when they are unusable."""


@dataclass(frozen=True)
class LoadResult:
    """How a load ended: the first ``num_loaded`` parts are in place, in ``seconds``."""

    num_loaded: int
    seconds: float
    failure: str | None = None


class TierIO:
    """Owns the copy and disk threads; everything submitted returns a future."""

    def __init__(self, device_blocks: DeviceRows) -> None:
        self._device_blocks = device_blocks
        self._copy = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-copy")
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-disk")
        cuda = device_blocks.is_cuda
        self._stream = torch.cuda.Stream(device_blocks.device) if cuda else None

    def load(self, parts: list[LoadPart]) -> Future[LoadResult]:
        """Start bringing ``parts`` back; disk-backed loads run on the disk thread."""
        pool = self._disk if any(p.medium == "disk" for p in parts) else self._copy
        return pool.submit(self._run_load, parts)

    def disk(self, work: Callable[[], None]) -> Future[None]:
        """Run a disk write or delete on the disk thread, after everything submitted before."""
        return self._disk.submit(_logged, work)

    def shutdown(self) -> None:
        """Finish queued work and stop both threads."""
        self._copy.shutdown(wait=True)
        self._disk.shutdown(wait=True)

    def _run_load(self, parts: list[LoadPart]) -> LoadResult:
        start = time.perf_counter()
        done, failure = 0, None
        for part in parts:
            try:
                data = part.source()
            except (BlockFileError, OSError) as e:
                failure = f"{part.medium} block {part.block_hash:#x}: {e}"
                logger.warning("KV tier load stopped at a bad block (a miss): %s", failure)
                break
            self._write(part.dst_block_id, data)
            done += 1
        if self._stream is not None:
            self._stream.synchronize()
        return LoadResult(done, time.perf_counter() - start, failure)

    def _write(self, block_id: int, data: torch.Tensor) -> None:
        if self._stream is None:
            self._device_blocks.write(block_id, data)
            return
        with torch.cuda.stream(self._stream):
            self._device_blocks.write(block_id, data, non_blocking=True)


def _logged(work: Callable[[], None]) -> None:
    try:
        work()
    except OSError:
        logger.exception("disk KV tier operation failed")
