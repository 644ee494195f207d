"""The running app's stats board, called from a CLI process attached to Ray: its reports
(``pdserve status``, a rollout's pool health), its cordons (a rollout taking a pool to 0) and
its handoffs (the cordoned pool's streams that outlast the drain)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.serve.pool_options import BOARD_DEPLOYMENT

_TIMEOUT_S = 30.0


def _call(app_name: str, method: str, *args: Any) -> Any:
    """``StatsBoard.<method>(*args)`` on ``app_name``'s board, its answer (needs an attached Ray
    driver)."""
    from ray import serve

    handle = serve.get_deployment_handle(BOARD_DEPLOYMENT, app_name)
    return getattr(handle, method).remote(*args).result(timeout_s=_TIMEOUT_S)


def board_snapshot(app_name: str) -> dict[str, list[dict[str, Any]]]:
    """The stats board's reports."""
    snapshot: dict[str, list[dict[str, Any]]] = _call(app_name, "snapshot")
    return snapshot


def board_cordon(app_name: str) -> Callable[[str, str, bool], None]:
    """``StatsBoard.cordon`` of ``app_name``'s board."""

    def cordon(pools_app: str, deployment: str, cordoned: bool) -> None:
        _call(app_name, "cordon", pools_app, deployment, cordoned)

    return cordon


def board_hand_off(app_name: str) -> Callable[[str, str], None]:
    """``StatsBoard.hand_off`` of ``app_name``'s board."""

    def hand_off(pools_app: str, deployment: str) -> None:
        _call(app_name, "hand_off", pools_app, deployment)

    return hand_off
