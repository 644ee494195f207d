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

A replica a router here held and holds no more has *left* (:func:`has_left`): Serve is stopping
it (or it died). The board's readers ask such a decode replica, while it still reports streams,
to hand them off (``StatsBoard.hand_off_replica``) instead of letting them run out its graceful
shutdown. One that comes back into a set (a router's late update) has not left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

_REPLICA_PREFIX = "SERVE_REPLICA::"
_LEFT_TTL_S = 600.0
"""How long a replica that left is remembered (a drain lasts its graceful shutdown, seconds)."""


class _Held:
    """Each deployment's set as its routers last told it, and a count of changes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sets: dict[tuple[str, str], frozenset[str]] = {}
        self.left: dict[tuple[tuple[str, str], str], float] = {}  # -> monotonic time it left
        self.version = 0


_held = _Held()


def hold(app_name: str, deployment: str, replica_ids: Iterable[str]) -> None:
    """A router of ``app_name``'s ``deployment`` holds exactly ``replica_ids`` now."""
    ids = frozenset(replica_ids)
    key = (app_name, deployment)
    now_s = time.monotonic()
    with _held.lock:
        before = _held.sets.get(key)
        if before == ids:
            return
        _held.sets[key] = ids
        _held.version += 1
        for replica_id in before or ():
            if replica_id not in ids:
                _held.left[(key, replica_id)] = now_s
        for replica_id in ids:
            _held.left.pop((key, replica_id), None)
        for entry, left_s in list(_held.left.items()):
            if now_s - left_s > _LEFT_TTL_S:
                del _held.left[entry]


def has_left(deployment: tuple[str, str] | None, replica_id: str) -> bool:
    """Whether a router here held replica ``replica_id`` of ``deployment`` and no longer does
    (Serve is stopping it, or it died)."""
    if deployment is None:
        return False
    with _held.lock:
        return (deployment, replica_id) in _held.left


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
        _held.left.clear()
        _held.version += 1
