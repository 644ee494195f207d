"""The running app's stats board, called from a CLI process attached to Ray: its reports
(``pdserve status``, a rollout's pool health), its cordons (a rollout taking a pool to 0) and
its handoffs (the cordoned pool's streams that outlast the drain)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.serve.pool_options import BOARD_DEPLOYMENT


def board_snapshot(app_name: str) -> dict[str, list[dict[str, Any]]]:
    """The stats board's reports (needs an attached Ray driver)."""
    from ray import serve

    handle = serve.get_deployment_handle(BOARD_DEPLOYMENT, app_name)
    snapshot: dict[str, list[dict[str, Any]]] = handle.snapshot.remote().result(timeout_s=30)
    return snapshot


def board_cordon(app_name: str) -> Callable[[str, str, bool], None]:
    """``StatsBoard.cordon`` of ``app_name``'s board (needs an attached Ray driver)."""

    def cordon(pools_app: str, deployment: str, cordoned: bool) -> None:
        from ray import serve

        handle = serve.get_deployment_handle(BOARD_DEPLOYMENT, app_name)
        handle.cordon.remote(pools_app, deployment, cordoned).result(timeout_s=30)

    return cordon


def board_hand_off(app_name: str) -> Callable[[str, str], None]:
    """``StatsBoard.hand_off`` of ``app_name``'s board (needs an attached Ray driver)."""

    def hand_off(pools_app: str, deployment: str) -> None:
        from ray import serve

        handle = serve.get_deployment_handle(BOARD_DEPLOYMENT, app_name)
        handle.hand_off.remote(pools_app, deployment).result(timeout_s=30)

    return hand_off
