"""The KV fingerprint each replica reported to the stats board, process-local.

A router narrows a fingerprinted request to the replicas of that fingerprint
(``kv_index.fingerprints``), reading each replica's from Serve's routing stats. Those reach the
routers a few seconds after a replica starts (the controller polls every replica, then
broadcasts); until then a new replica names no fingerprint and no fingerprinted request — every
request of a P/D pair — is placed on it, however idle it is. The board hears a replica's
fingerprint first (its constructor reports), and this process's board reader
(``cluster.serve.clients.PoolWatch``) keeps it here for the routers to fall back on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

_lock = threading.Lock()
_by_replica: dict[str, str] = {}


def publish(by_replica: Mapping[str, str]) -> None:
    """The board's latest view: replica id -> fingerprint, of every replica reporting now
    (replaces the previous view; a replica gone from the board is forgotten)."""
    fresh = {replica_id: fp for replica_id, fp in by_replica.items() if fp}
    with _lock:
        _by_replica.clear()
        _by_replica.update(fresh)


def of(replica_id: str) -> str:
    """The fingerprint the board last reported for ``replica_id`` ("" when none)."""
    with _lock:
        return _by_replica.get(replica_id, "")
