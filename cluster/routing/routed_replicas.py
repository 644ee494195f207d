"""The replicas this process's Serve routers hold, by deployment: process-local.

The stats board and Serve's routers learn of a replica at different moments. A replica Serve
stops (a scale-down, a stepped rollout's step) leaves every router's set at once but reports to
the board until it has drained; a new one reports from its constructor, before the controller
lists it running and the routers' long poll brings it. Read from the board alone, either looks
live while no router here can place a request on it, and a request paired with its version or
app waits on a deployment with no replica: Serve holds it there and cold-starts a replica for
it (seconds; on a GPU node a whole model load). So the board's readers
(``cluster.serve.clients.PoolWatch``) count a replica live only while this process's routers of
its deployment hold it (``serve_router`` tells :func:`hold` each new set). A deployment no
router here has routed to yet is judged by the board alone: its first request starts the router.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

_REPLICA_PREFIX = "SERVE_REPLICA::"


class _Held:
    """Each deployment's set as its routers last told it, and a count of changes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sets: dict[tuple[str, str], frozenset[str]] = {}
        self.version = 0


_held = _Held()


def hold(app_name: str, deployment: str, replica_ids: Iterable[str]) -> None:
    """A router of ``app_name``'s ``deployment`` holds exactly ``replica_ids`` now."""
    ids = frozenset(replica_ids)
    with _held.lock:
        if _held.sets.get((app_name, deployment)) != ids:
            _held.sets[(app_name, deployment)] = ids
            _held.version += 1


def deployment_of(actor_name: str) -> tuple[str, str] | None:
    """``(app, deployment)`` of a replica from its actor name
    (``SERVE_REPLICA::<app>#<deployment>#<id>``, as a board report carries it); None for a
    name without an app."""
    if not actor_name.startswith(_REPLICA_PREFIX):
        return None
    parts = actor_name[len(_REPLICA_PREFIX) :].split("#")
    return (parts[0], parts[1]) if len(parts) == 3 and parts[0] else None


def routable(deployment: tuple[str, str] | None, replica_id: str) -> bool:
    """Whether a request can be placed on replica ``replica_id`` of ``deployment``
    (:func:`deployment_of` its actor name): its routers here hold it, or none here routes to
    that deployment yet (or it is of no Serve app)."""
    if deployment is None:
        return True
    with _held.lock:
        held = _held.sets.get(deployment)
    return held is None or replica_id in held


def version() -> int:
    """Changes whenever a router's set changes (readers recount then)."""
    with _held.lock:
        return _held.version


def forget() -> None:
    """No router holds anything (a unit test's fresh start)."""
    with _held.lock:
        _held.sets.clear()
        _held.version += 1
