"""Environment the KV data plane wants in the worker processes that run it.

glibc's malloc serves every allocation above its mmap threshold (128 KiB at start, adapting up
to 32 MiB) with a fresh ``mmap`` and hands free heap tops above its trim threshold back to the
kernel. gRPC's Python layer allocates a few buffers of a chunk's size (1-4 MiB) per message on
each side, so by default many messages pay page faults and page zeroing: measured here, about a
quarter of the importer's CPU per byte and a third of a 4K-token prompt's pull time
(docs/benchmarks.md). Raising both thresholds keeps those buffers on the heap, reused.

glibc reads these variables once, at process start, so they cannot be set from inside a running
worker. The deploy code passes :data:`MALLOC_ENV` to the processes that export or import KV --
Ray ``runtime_env={"env_vars": dict(MALLOC_ENV)}`` on the prefill and decode deployments -- and
never sets it on the driver or machine-wide. Without it everything still works, only slower.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_MIB = 1024 * 1024

MALLOC_ENV: Mapping[str, str] = MappingProxyType(
    {
        # Well above the largest message (a chunk: <= 4 MiB plus a few bytes of framing).
        "MALLOC_MMAP_THRESHOLD_": str(16 * _MIB),
        # Keep up to 128 MiB of freed heap per arena instead of unmapping it after every message.
        "MALLOC_TRIM_THRESHOLD_": str(128 * _MIB),
    }
)
"""glibc malloc settings for prefill and decode worker processes (see the module docstring)."""
