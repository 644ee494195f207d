"""A step's small host <-> device copies, made so that the host never waits for the device.

On CUDA two kinds of copy stall the host. A host -> device copy from pageable memory (what
``torch.tensor(list, device=cuda)`` does) returns only once the stream has drained, and a
device -> host read (``.tolist()``, ``.item()``) waits for every kernel queued before it. So:

- :func:`upload` stages values in pinned memory and copies them asynchronously, in stream order;
- :class:`DeviceReader` queues the device -> host copies of a step's results (sampled ids,
  logprobs) into pinned buffers on a side stream, behind an event, and
  :meth:`PendingRead.wait` is the one place where the engine's step loop waits for the device —
  once per step, for the step before the one it has just queued (``engine.async_scheduling``).

On a CPU both are plain tensor operations; the same calls keep one code path, and the reader
still counts its waits, which the tests of the step loop read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

Values = Sequence[int] | Sequence[float] | Sequence[Sequence[int]]


def stage(values: Values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a host tensor to copy to ``device`` from: pinned when that is CUDA."""
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")


def upload(values: Values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``; on CUDA through pinned memory, without waiting
    for the stream (the copy is ordered before the kernels queued after it)."""
    host = stage(values, dtype, device)
    return host if device.type != "cuda" else host.to(device, non_blocking=True)


class PendingRead:
    """Device tensors on their way to the host; :meth:`wait` hands the host copies out."""

    def __init__(
        self, host: list[torch.Tensor], event: torch.cuda.Event | None, reader: DeviceReader
    ) -> None:
        self._host = host
        self._event = event
        self._reader = reader

    def wait(self) -> list[torch.Tensor]:
        """Block until the copies landed; the host tensors, in the order given to ``start``."""
        if self._event is not None:
            with self._reader.intended_wait():
                self._event.synchronize()
        self._reader.num_waits += 1
        return self._host


class DeviceReader:
    """Starts device -> host reads; counts how often the host waited for one (``num_waits``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.num_waits = 0
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._strict = False

    @contextlib.contextmanager
    def forbid_other_syncs(self) -> Iterator[None]:
        """CUDA: meanwhile any call that makes the host wait for the device raises
        (``torch.cuda.set_sync_debug_mode("error")``) — except this reader's own waits. For
        tests and benchmarks proving a step has no other."""
        if self.device.type != "cuda":
            yield
            return
        torch.cuda.set_sync_debug_mode("error")
        self._strict = True
        try:
            yield
        finally:
            self._strict = False
            torch.cuda.set_sync_debug_mode(0)

    @contextlib.contextmanager
    def intended_wait(self) -> Iterator[None]:
        """The one wait a step makes: allowed under :meth:`forbid_other_syncs`."""
        if not self._strict:
            yield
            return
        torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("error")

    def start(self, tensors: Sequence[torch.Tensor]) -> PendingRead:
        """Queue copies of ``tensors`` (after the work already queued on the current stream)
        into pinned host memory; returns at once."""
        if self._stream is None:
            return PendingRead(list(tensors), None, self)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        host: list[torch.Tensor] = []
        with torch.cuda.stream(self._stream):
            for tensor in tensors:
                tensor.record_stream(self._stream)  # not reused before the copy read it
                copy = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                copy.copy_(tensor, non_blocking=True)
                host.append(copy)
            event = torch.cuda.Event()
            event.record(self._stream)
        return PendingRead(host, event, self)
