"""Transfer metrics: a small event interface plus an in-memory implementation.

Both sides report through :class:`TransferMetrics`; the roles adapt it to Prometheus (counters
for bytes, transfers and failures by reason, a gauge for in-flight transfers, a histogram for
durations, a counter of lease releases by cause). :class:`InMemoryTransferMetrics` is the
default and what the tests read.
"""

from __future__ import annotations

import bisect
import enum
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from core.kv_handle import TransferFailure
from core.stats import TransferStats

DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Upper bounds of the duration histogram (the last bucket is +Inf)."""


class TransferSide(enum.StrEnum):
    """Which end of a transfer reports."""

    EXPORT = "export"
    IMPORT = "import"


class TransferMetrics(Protocol):
    """Receives transfer events; implementations must be thread-safe."""

    def transfer_started(self, side: TransferSide) -> None:
        """A pull began on ``side`` (in-flight + 1)."""
        ...

    def transfer_finished(
        self,
        side: TransferSide,
        num_bytes: int,
        duration_s: float,
        failure: TransferFailure | None,
    ) -> None:
        """A pull ended on ``side`` (in-flight - 1) after ``num_bytes``; failure reason or None."""
        ...

    def lease_released(self, cause: str) -> None:
        """An export's blocks were freed; ``cause`` is a ``ReleaseCause`` value (e.g. expired)."""
        ...

    def call_rejected(self) -> None:
        """A call to the export server was refused for a missing or wrong auth token."""
        ...

    def pull_path(self, path: str, fallback_reasons: Sequence[str] = ()) -> None:
        """An import chose its path (``grpc``, ``same_node``, ``cuda_ipc``), and why it did not
        take each faster one (``transfer.paths``)."""
        ...


@dataclass(frozen=True)
class TransferMetricsSnapshot:
    """Point-in-time copy of :class:`InMemoryTransferMetrics`."""

    bytes_total: dict[str, int]
    transfers_total: dict[tuple[str, str], int]
    """(side, "ok" or the failure reason) -> count."""
    in_flight: dict[str, int]
    duration_bucket_counts: dict[str, tuple[int, ...]]
    """side -> counts per bucket of ``DURATION_BUCKETS_S`` plus +Inf (not cumulative)."""
    duration_sum_s: dict[str, float]
    lease_releases: dict[str, int]
    rejected_calls: int = 0
    pulls_by_path: dict[str, int] | None = None
    same_node_fallbacks: dict[str, int] | None = None

    def failures(self, side: TransferSide) -> dict[str, int]:
        """Failure reason -> count for one side."""
        return {
            outcome: n
            for (s, outcome), n in self.transfers_total.items()
            if s == side and outcome != "ok"
        }

    def role_stats(self, side: TransferSide) -> TransferStats:
        """The transfer part of a role replica's ``ReplicaStats`` for ``side``: in flight,
        bytes, finished transfers, seconds, failures (total and by reason), expired leases."""
        failures = self.failures(side)
        return TransferStats(
            in_flight=self.in_flight.get(side, 0),
            bytes_total=self.bytes_total.get(side, 0),
            transfers_total=sum(n for (s, _), n in self.transfers_total.items() if s == side),
            seconds_total=self.duration_sum_s.get(side, 0.0),
            failures_total=sum(failures.values()),
            failures_by_reason=failures,
            leases_expired_total=self.lease_releases.get("expired", 0),
            unauthenticated_calls_total=self.rejected_calls if side == "export" else 0,
            pulls_by_path=dict(self.pulls_by_path or {}) if side == "import" else {},
            same_node_fallbacks_by_reason=(
                dict(self.same_node_fallbacks or {}) if side == "import" else {}
            ),
        )


class InMemoryTransferMetrics:
    """Thread-safe counters and histograms kept in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: Counter[str] = Counter()
        self._transfers: Counter[tuple[str, str]] = Counter()
        self._in_flight: Counter[str] = Counter()
        self._buckets: dict[str, list[int]] = {}
        self._duration_sum_s: dict[str, float] = {}
        self._releases: Counter[str] = Counter()
        self._rejected_calls = 0
        self._paths: Counter[str] = Counter()
        self._fallbacks: Counter[str] = Counter()

    def transfer_started(self, side: TransferSide) -> None:
        """A pull began on ``side``."""
        with self._lock:
            self._in_flight[side] += 1

    def transfer_finished(
        self,
        side: TransferSide,
        num_bytes: int,
        duration_s: float,
        failure: TransferFailure | None,
    ) -> None:
        """A pull ended on ``side``."""
        bucket = bisect.bisect_left(DURATION_BUCKETS_S, duration_s)
        with self._lock:
            self._in_flight[side] -= 1
            self._bytes[side] += num_bytes
            self._transfers[(side, "ok" if failure is None else str(failure))] += 1
            counts = self._buckets.setdefault(side, [0] * (len(DURATION_BUCKETS_S) + 1))
            counts[bucket] += 1
            self._duration_sum_s[side] = self._duration_sum_s.get(side, 0.0) + duration_s

    def lease_released(self, cause: str) -> None:
        """An export's blocks were freed for ``cause``."""
        with self._lock:
            self._releases[cause] += 1

    def call_rejected(self) -> None:
        """A call was refused for its token."""
        with self._lock:
            self._rejected_calls += 1

    def pull_path(self, path: str, fallback_reasons: Sequence[str] = ()) -> None:
        """An import's path, and why it did not take each faster one."""
        with self._lock:
            self._paths[path] += 1
            for reason in fallback_reasons:
                self._fallbacks[reason] += 1

    def snapshot(self) -> TransferMetricsSnapshot:
        """A consistent copy of every counter."""
        with self._lock:
            return TransferMetricsSnapshot(
                bytes_total=dict(self._bytes),
                transfers_total=dict(self._transfers),
                in_flight=dict(self._in_flight),
                duration_bucket_counts={s: tuple(c) for s, c in self._buckets.items()},
                duration_sum_s=dict(self._duration_sum_s),
                lease_releases=dict(self._releases),
                rejected_calls=self._rejected_calls,
                pulls_by_path=dict(self._paths),
                same_node_fallbacks=dict(self._fallbacks),
            )
