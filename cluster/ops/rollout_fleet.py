"""The Serve side of the rollout seam: :class:`ServeRolloutFleet` is a
:class:`~cluster.ops.rollout.RolloutFleet` over two Serve apps.

Each version's pools are deployments of their own app (the old version's in the running app
or in the pools app an earlier rollout left serving, the new one's in this rollout's app), so a
step is an in-place ``num_replicas`` update of one deployment through Serve's REST API — what
``pdserve scale`` sends; nothing else restarts.
Health joins Serve's view (replica states, the deployment's status) with the running app's
stats board, which both apps' replicas report to: a replica counts as healthy once Serve has it
RUNNING and its report is fresh on the board; its requests in flight are the running, waiting
and (prefill) export-pinned ones it reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cluster.ops.rollout import PoolHealth, Version
from cluster.serve.pool_options import pool_deployment_name
from core.config import Role

FAILED_DEPLOYMENT_STATUSES = frozenset({"DEPLOY_FAILED"})
"""Serve's deployment statuses that mean a replica of the pool failed to start."""
IN_FLIGHT_FIELDS = ("num_running", "num_waiting", "exports_pinned")
"""A replica's reported stats that hold requests (or their KV, for a pull) on it."""


class ServeApps(Protocol):
    """What the fleet needs of Serve's REST API (``cluster.ops.rest.ServeRest``)."""

    def app_details(self, app_name: str) -> dict[str, Any] | None:
        """One application's details, or None when it is not deployed."""
        ...

    def scale(self, app_name: str, replicas: Mapping[str, int]) -> None:
        """Set fixed replica counts of deployments of ``app_name``, in place."""
        ...


BoardReader = Callable[[], Mapping[str, list[dict[str, Any]]]]
"""The running app's stats board snapshot (``StatsBoard.snapshot``)."""
BoardCordon = Callable[[str, str, bool], None]
"""``(app, deployment, cordoned)`` on the running app's stats board (``StatsBoard.cordon``)."""
BoardHandOff = Callable[[str, str], None]
"""``(app, deployment)`` on the running app's stats board (``StatsBoard.hand_off``)."""


class ServeRolloutFleet:
    """One served model's pools in the old version's app and the new version's app."""

    def __init__(
        self,
        rest: ServeApps,
        board: BoardReader,
        apps: Mapping[Version, str],
        scope: str,
        cordon: BoardCordon,
        hand_off: BoardHandOff,
    ) -> None:
        self._rest, self._board, self._apps, self._scope = rest, board, dict(apps), scope
        self._cordon, self._hand_off = cordon, hand_off

    def set_replicas(self, version: Version, role: Role, num_replicas: int) -> None:
        """An in-place ``num_replicas`` update of ``version``'s ``role`` deployment."""
        self._rest.scale(
            self._apps[version], {pool_deployment_name(role, self._scope): num_replicas}
        )

    def cordon(self, version: Version, role: Role, cordoned: bool) -> None:
        """Keep the ingress's new requests off ``version``'s ``role`` pool (or stop to)."""
        self._cordon(self._apps[version], pool_deployment_name(role, self._scope), cordoned)

    def hand_off(self, version: Version, role: Role) -> None:
        """Have cordoned ``version``'s ``role`` replicas hand their requests off."""
        self._hand_off(self._apps[version], pool_deployment_name(role, self._scope))

    def health(self, version: Version, role: Role) -> PoolHealth:
        """Serve's replicas of the deployment, joined with their board reports."""
        deployment = pool_deployment_name(role, self._scope)
        return pool_health(self._rest, self._board(), self._apps[version], deployment)


def pool_health(
    rest: ServeApps,
    board: Mapping[str, list[dict[str, Any]]],
    app_name: str,
    deployment: str,
) -> PoolHealth:
    """Serve's replicas of ``app_name``'s ``deployment``, joined with their reports on
    ``board`` (a ``StatsBoard.snapshot``)."""
    app = rest.app_details(app_name) or {}
    details = app.get("deployments", {}).get(deployment, {})
    replicas: list[dict[str, Any]] = details.get("replicas", [])
    reports = {str(r["replica_id"]): r for pool in board.values() for r in pool}
    num_healthy, num_in_flight = 0, 0
    for replica in replicas:
        report = reports.get(str(replica.get("replica_id")))
        if report is None:
            continue
        stats: Mapping[str, Any] = report.get("stats") or {}
        num_in_flight += sum(int(stats.get(name, 0)) for name in IN_FLIGHT_FIELDS)
        if replica.get("state") == "RUNNING":
            num_healthy += 1
    failed = details.get("status") in FAILED_DEPLOYMENT_STATUSES
    return PoolHealth(len(replicas), num_healthy, int(failed), num_in_flight)
