"""KV blocks between the device tensor and its pinned host mirror, off the compute stream.

On CUDA a :class:`BlockCopier` copies whole blocks on its own side stream: the side stream first
waits (on the device) for the compute stream's work so far, then copies each run of consecutive
block ids with one asynchronous ``cudaMemcpyAsync`` between the KV tensor and the pinned mirror,
and records an event — a :class:`Fence`. The caller returns at once; nobody waits on the host:

- an export (device -> host) is waited for by whoever reads the block's bytes — the transfer
  layer's threads, through ``KVStorage.block_view`` — never by the engine thread;
- an import (host -> device) is waited for by the compute stream itself, device-side, before the
  next step (``KVStorage.fence_uploads``), and only if the copy is still in flight.

Without CUDA (a CPU engine with a forced mirror, as in the tests) the same runs are copied at
once and the fences are already done. :class:`StagingTracker` is the device-independent
bookkeeping of which fences are still pending.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import torch


class Fence(Protocol):
    """The end of one staged copy."""

    def done(self) -> bool:
        """True once the copy has finished."""
        ...

    def wait_host(self) -> None:
        """Block the calling thread until the copy has finished."""
        ...

    def wait_compute(self) -> None:
        """Make the compute (current) stream wait for the copy, without blocking the host."""
        ...

    def wait_source(self) -> None:
        """Block the calling thread until the work the copy waited for (whatever wrote its
        source blocks) has finished; the copy itself may still run."""
        ...


class DoneFence:
    """A copy that finished before its call returned (the CPU path)."""

    def done(self) -> bool:
        """Always True."""
        return True

    def wait_host(self) -> None:
        """Nothing to wait for."""

    def wait_compute(self) -> None:
        """Nothing to wait for."""

    def wait_source(self) -> None:
        """Nothing to wait for."""


DONE = DoneFence()


class CudaFence:
    """A copy on a side stream, marked by an event recorded after it (and one recorded before
    it, once the side stream caught up with the compute stream: ``source``)."""

    def __init__(
        self, event: torch.cuda.Event, device: torch.device, source: torch.cuda.Event
    ) -> None:
        self.event = event
        self.device = device
        self.source = source

    def done(self) -> bool:
        """True once the side stream passed the event."""
        return bool(self.event.query())

    def wait_host(self) -> None:
        """Block this thread until the event has passed."""
        self.event.synchronize()

    def wait_compute(self) -> None:
        """Order the current stream's later work after the copy (device-side)."""
        torch.cuda.current_stream(self.device).wait_event(self.event)

    def wait_source(self) -> None:
        """Block this thread until the compute the copy waited for has finished."""
        self.source.synchronize()


def contiguous_runs(block_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Half-open ``(start, stop)`` runs of consecutive ids covering ``block_ids`` once each."""
    runs: list[tuple[int, int]] = []
    for block_id in sorted(set(block_ids)):
        if runs and runs[-1][1] == block_id:
            runs[-1] = (runs[-1][0], block_id + 1)
        else:
            runs.append((block_id, block_id + 1))
    return runs


class BlockCopier:
    """Copies runs of whole blocks between ``kv`` and ``host`` (same shape, block-major)."""

    def __init__(self, kv: torch.Tensor, host: torch.Tensor) -> None:
        if kv.shape != host.shape:
            raise ValueError(f"KV {tuple(kv.shape)} and host mirror {tuple(host.shape)} differ")
        self.kv = kv
        self.host = host
        self.device = kv.device
        self.stream = torch.cuda.Stream(kv.device) if kv.device.type == "cuda" else None

    def to_host(self, block_ids: Sequence[int]) -> Fence:
        """Start copying ``block_ids`` KV -> host mirror."""
        return self._copy(self.host, self.kv, contiguous_runs(block_ids))

    def to_device(self, block_ids: Sequence[int]) -> Fence:
        """Start copying ``block_ids`` host mirror -> KV."""
        return self._copy(self.kv, self.host, contiguous_runs(block_ids))

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, runs: list[tuple[int, int]]) -> Fence:
        if self.stream is None:
            for start, stop in runs:
                dst[start:stop].copy_(src[start:stop])  # [n, L, 2, bs, Hkv, D]
            return DONE
        # NOTE: the side stream waits for every kernel queued so far (the prefill that wrote
        # these blocks; any step still reading a block this import reuses), then copies.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            source = torch.cuda.Event()
            source.record(self.stream)
            for start, stop in runs:
                dst[start:stop].copy_(src[start:stop], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return CudaFence(event, self.device, source)


class StagingTracker:
    """Pending copies: per block for exports (read on any thread), a list for imports.

    Thread-safe: the engine thread records, transfer threads wait on exported blocks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._to_host: dict[int, Fence] = {}
        self._to_device: list[Fence] = []

    def exported(self, block_ids: Sequence[int], fence: Fence) -> None:
        """``block_ids`` are being copied to the host under ``fence``."""
        with self._lock:
            for block_id in block_ids:
                self._to_host[block_id] = fence

    def wait_host(self, block_id: int) -> None:
        """Return once the latest copy of ``block_id`` to the host (if any) has finished."""
        with self._lock:
            fence = self._to_host.get(block_id)
        if fence is None:
            return
        fence.wait_host()
        with self._lock:
            if self._to_host.get(block_id) is fence:  # a newer copy may have replaced it
                del self._to_host[block_id]

    def wait_source(self, block_id: int) -> None:
        """Return once the compute that wrote ``block_id`` before its latest copy to the host
        (if one is pending) has finished: its device bytes are final."""
        with self._lock:
            fence = self._to_host.get(block_id)
        if fence is not None:
            fence.wait_source()

    def imported(self, fence: Fence) -> None:
        """Blocks are being copied to the device under ``fence``."""
        with self._lock:
            self._to_device.append(fence)

    def fence_uploads(self) -> int:
        """Order the compute stream after every import still in flight; how many were."""
        with self._lock:
            pending, self._to_device = self._to_device, []
        in_flight = [fence for fence in pending if not fence.done()]
        for fence in in_flight:
            fence.wait_compute()
        return len(in_flight)

    @property
    def num_pending_exports(self) -> int:
        """Blocks whose copy to the host nobody has waited for yet."""
        with self._lock:
            return len(self._to_host)
