"""Fault injection on the KV export side: break pulls on purpose, the same way every time.

A :class:`FaultInjection` is handed to an exporter (``KVExportServer``, ``InProcKVTransport``)
at construction or swapped in later with ``set_faults``; it applies to every pull that starts
afterwards. Chunks are numbered from 0 in stream order. The faults model the failures the import
side must survive:

* ``fail_after_chunks=k`` — send k chunks, then abort the stream (an exporter error mid-stream).
* ``corrupt_chunk_seq=k`` — flip one payload byte of chunk k after its checksum was computed.
* ``delay_per_chunk_s=d`` — wait d seconds before each chunk (a slow or stalled exporter; the
  wait ends early when the pull is cancelled, so a stalled pull holds no thread past its end).
* ``drop_release=True`` — answer ``Release`` without freeing, so only the lease can reclaim.

Production configs never set any of these; ``FaultInjection()`` injects nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FaultInjection:
    """Which faults an exporter injects into the pulls it serves."""

    fail_after_chunks: int | None = None
    corrupt_chunk_seq: int | None = None
    delay_per_chunk_s: float = 0.0
    drop_release: bool = False

    def __post_init__(self) -> None:
        if self.fail_after_chunks is not None and self.fail_after_chunks < 0:
            raise ValueError(f"fail_after_chunks must be >= 0, got {self.fail_after_chunks}")
        if self.corrupt_chunk_seq is not None and self.corrupt_chunk_seq < 0:
            raise ValueError(f"corrupt_chunk_seq must be >= 0, got {self.corrupt_chunk_seq}")
        if self.delay_per_chunk_s < 0:
            raise ValueError(f"delay_per_chunk_s must be >= 0, got {self.delay_per_chunk_s}")

    @property
    def active(self) -> bool:
        """True when any fault is set."""
        return self != FaultInjection()

    def corrupt(self, seq: int, pieces: list[bytes | memoryview]) -> list[bytes | memoryview]:
        """The payload ``pieces`` of chunk ``seq``, its first byte flipped if it is the one."""
        if seq != self.corrupt_chunk_seq or not pieces or not pieces[0]:
            return pieces
        first = bytearray(pieces[0])
        first[0] ^= 0xFF
        return [bytes(first), *pieces[1:]]

    def should_fail(self, seq: int) -> bool:
        """True when chunk ``seq`` must not be sent because the stream fails here."""
        return self.fail_after_chunks is not None and seq >= self.fail_after_chunks
