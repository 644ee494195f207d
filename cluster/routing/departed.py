"""Replicas Serve no longer routes to that may still report to the stats board: process-local.

A replica Serve stops (a scale-down, a stepped rollout's step) leaves every router's replica
set at once but keeps reporting to the board while it drains its requests. Read from the board
alone it still looks live, so the ingress could pair a new request with its version or app, and
Serve would hold that request until the pool grew again. The routers of this process
(``serve_router``) mark each replica that leaves their set, and unmark one that comes back;
the board's readers
(``cluster.serve.clients.PoolWatch``) drop the marked ones' reports and forget a mark once the
replica stops reporting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

_lock = threading.Lock()
_departed: set[str] = set()


def mark(replica_id: str) -> None:
    """Serve stopped routing to ``replica_id`` (its ``unique_id``)."""
    with _lock:
        _departed.add(replica_id)


def returned(replica_ids: Iterable[str]) -> None:
    """These replicas are in a router's set again (Serve drops one it could not reach for a
    moment, then lists it once more): they count as live."""
    with _lock:
        _departed.difference_update(replica_ids)


def departed() -> frozenset[str]:
    """The replicas marked and still reporting (as of the last :func:`prune`)."""
    with _lock:
        return frozenset(_departed)


def prune(reporting: Iterable[str]) -> None:
    """Forget the marks of replicas no longer among ``reporting`` (they are gone)."""
    keep = set(reporting)
    with _lock:
        _departed.intersection_update(keep)
