"""A worker's transfer counters in its stats: the metrics its transport records, one side's view.

Both roles' workers record transfers through their transport's ``InMemoryTransferMetrics``
(export side on prefill, import side on decode) and report them inside ``ReplicaStats``.
"""

from __future__ import annotations

import dataclasses

from core.stats import ReplicaStats
from transfer import InMemoryTransferMetrics, KVTransport, TransferSide


def transport_metrics(
    transport: KVTransport, given: InMemoryTransferMetrics | None = None
) -> InMemoryTransferMetrics | None:
    """``given``, else the transport's own ``metrics`` when it records in memory, else None."""
    found = getattr(transport, "metrics", None)
    return given or (found if isinstance(found, InMemoryTransferMetrics) else None)


def with_transfer_stats(
    stats: ReplicaStats, metrics: InMemoryTransferMetrics | None, side: TransferSide
) -> ReplicaStats:
    """``stats`` with ``side``'s transfer counters from ``metrics`` (unchanged without them)."""
    if metrics is None:
        return stats
    return dataclasses.replace(stats, transfer=metrics.snapshot().role_stats(side))
