"""A stepped rollout's pools apps after the fact: ``pdserve down`` removes them with the app and
forgets the rollout; ``pdserve scale`` resizes the pools that serve the model now (the second
app's after a finished rollout) and is refused while a rollout owns the sizes; ``pdserve
status`` shows the live pools app's replicas and marks the superseded pools idle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cluster.ops import launcher, live_pools, rollout_state, scaling
from cluster.ops.rollout_state import RolloutPhase, RolloutState, read_rollout, write_rollout
from cluster.ops.status_view import collect_pools, render_status
from cluster.planner.decisions import decisions_key
from cluster.routing.kv_index import actor as index_actor
from cluster.serve.planner_settings import settings_key
from core.errors import ConfigError, UnavailableError
from tests.unit.cluster.ops.upgrade_fakes import FakeRest, offline_upgrade

pytestmark = pytest.mark.timeout(30)

APP = "pdserve"
POOLS_APP = "pdserve-rollout"


class ServeApps(FakeRest):
    """Serve's REST API over several apps: ``apps`` maps each to its details."""

    def __init__(self, apps: dict[str, dict[str, Any]]) -> None:
        super().__init__(None)
        self.apps = apps
        self.board: dict[str, list[dict[str, Any]]] = {}  # the running app's board snapshot

    def details(self) -> dict[str, Any]:
        return {"applications": self.apps}

    def app_details(self, app_name: str) -> dict[str, Any] | None:
        return self.apps.get(app_name)

    def remove(self, app_name: str) -> None:
        self.calls.append(("remove", app_name))
        self.apps.pop(app_name, None)

    def scale(self, app_name: str, replicas: dict[str, int]) -> None:
        self.calls.append(("scale", (app_name, replicas)))


def deployments(*names: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "deployments": {
            name: {
                "status": "HEALTHY",
                "target_num_replicas": replicas,
                "replicas": [
                    {"replica_id": f"{name}-{i}", "state": "RUNNING", "node_ip": "10.0.0.1"}
                    for i in range(replicas)
                ],
            }
            for name in names
        }
    }


def rollout(phase: RolloutPhase, *, model: str = "", step: int = 2) -> RolloutState:
    return RolloutState(APP, model, POOLS_APP, 1, 2, step, phase)


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ServeApps:
    """The app and its finished rollout's pools app, REST only (no Ray)."""
    rest = ServeApps(
        {
            APP: deployments("Ingress", "StatsBoard", "Prefill", "Decode", replicas=0),
            POOLS_APP: deployments("RolloutPools", "Prefill", "Decode"),
        }
    )
    for module in (launcher, scaling):
        offline_upgrade(module, tmp_path, monkeypatch, rest)  # type: ignore[arg-type]

    def cordon(app: str) -> Any:
        return lambda pools_app, deployment, on: rest.calls.append(
            ("cordon" if on else "uncordon", (app, pools_app, deployment))
        )

    monkeypatch.setattr(scaling, "board_cordon", cordon)
    monkeypatch.setattr(scaling, "board_snapshot", lambda app: rest.board)
    monkeypatch.setattr(index_actor, "kill_index_actor", lambda app: True)
    monkeypatch.setattr(
        "ray.experimental.internal_kv._internal_kv_del", lambda key: rest.calls.append(("del", key))
    )
    return rest


def test_down_removes_the_pools_apps_first_and_forgets_the_rollout(serve: ServeApps) -> None:
    serve.apps["pdserve-rollout-2"] = deployments("RolloutPools", "Decode")  # state lost
    serve.apps["pdserve-rollouts"] = serve.apps["other"] = deployments("Ingress")
    write_rollout(rollout(RolloutPhase.DONE))
    message = launcher.down(APP, dashboard_url="http://dash")
    assert serve.calls == [
        ("remove", POOLS_APP),
        ("remove", "pdserve-rollout-2"),
        ("remove", APP),
        ("del", settings_key(APP)),  # the planner's settings and log: the Ray cluster stays
        ("del", decisions_key(APP)),
    ]
    assert message == f"removed app {POOLS_APP}, pdserve-rollout-2, {APP} from http://dash"
    assert read_rollout(APP) is None
    assert set(serve.apps) == {"pdserve-rollouts", "other"}  # not this app's


def test_down_without_a_rollout_removes_only_the_app(serve: ServeApps) -> None:
    del serve.apps[POOLS_APP]
    assert launcher.down(APP, dashboard_url="http://dash") == f"removed app {APP} from http://dash"
    assert serve.calls[0] == ("remove", APP) and len(serve.calls) == 3


def test_scale_after_a_finished_rollout_resizes_the_live_pools_app(serve: ServeApps) -> None:
    write_rollout(rollout(RolloutPhase.DONE))
    assert scaling.scale(APP, 2, 3) == scaling.Scaled(POOLS_APP, {"Prefill": 2, "Decode": 3})
    assert serve.calls[-1] == ("scale", (POOLS_APP, {"Prefill": 2, "Decode": 3}))
    serve.calls.clear()
    write_rollout(rollout(RolloutPhase.ROLLED_BACK, step=0))
    scaling.scale(APP, None, 4)
    assert serve.calls == [("uncordon", (APP, APP, "Decode")), ("scale", (APP, {"Decode": 4}))]


def test_a_pool_scaled_to_0_is_cordoned_and_quiet_first(
    serve: ServeApps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scaling, "QUIET_S", 0.0)
    monkeypatch.setattr(scaling, "POLL_S", 0.0)
    del serve.apps[POOLS_APP]
    serve.apps[APP] = deployments("Ingress", "StatsBoard", "Prefill", "Decode")
    busy = {"replica_id": "Prefill-0", "stats": {"num_running": 1}}
    serve.board = {"prefill": [busy]}
    polls: list[int] = []

    def snapshot(app: str) -> dict[str, list[dict[str, Any]]]:
        polls.append(1)
        if len(polls) == 3:  # its last request ended
            busy["stats"] = {"num_running": 0}
        return serve.board

    monkeypatch.setattr(scaling, "board_snapshot", snapshot)
    scaling.scale(APP, 0, 2)
    assert serve.calls == [
        ("uncordon", (APP, APP, "Decode")),
        ("cordon", (APP, APP, "Prefill")),  # the ingress pairs nothing new with it
        ("scale", (APP, {"Prefill": 0, "Decode": 2})),  # once nothing was in flight
    ]
    assert len(polls) == 3


@pytest.mark.parametrize("phase", [RolloutPhase.RUNNING, RolloutPhase.PAUSED, RolloutPhase.FAILED])
def test_scale_is_refused_while_a_rollout_owns_the_sizes(
    serve: ServeApps, phase: RolloutPhase
) -> None:
    write_rollout(rollout(phase))
    with pytest.raises(ConfigError, match=f"rollout of {APP} is {phase.value} at step 2/"):
        scaling.scale(APP, 2, 3)
    assert serve.calls == []


def test_a_rollout_of_another_model_leaves_this_models_pools_in_the_app(
    serve: ServeApps,
) -> None:
    serve.apps[APP] = deployments("Ingress", "Decode-a", "Decode-b")
    write_rollout(rollout(RolloutPhase.RUNNING, model="b"))
    scaling.scale(APP, None, 2, model="a")
    assert serve.calls[-1] == ("scale", (APP, {"Decode-a": 2}))
    with pytest.raises(ConfigError, match="rollout of b is running"):
        scaling.scale(APP, None, 2, model="b")


def test_status_shows_the_live_pools_app_and_marks_the_superseded_pools_idle(
    serve: ServeApps,
) -> None:
    write_rollout(rollout(RolloutPhase.DONE))
    reports = {"decode": [{"replica_id": "Decode-0", "stats": None}]}
    pools = collect_pools(APP, serve.apps, reports)
    shown = [(p["app"], p["pool"], p["idle"], len(p["replicas"])) for p in pools]
    assert shown == [
        (APP, "Prefill", True, 0),
        (APP, "Decode", True, 0),
        (APP, "Ingress", False, 0),
        (POOLS_APP, f"Prefill@{POOLS_APP}", False, 1),
        (POOLS_APP, f"Decode@{POOLS_APP}", False, 1),
    ]
    assert {p["deployment"] for p in pools if p["app"] == POOLS_APP} == {"Prefill", "Decode"}
    console = Console(width=80, record=True)
    status = {"app": APP, "status": "RUNNING", "endpoint": "e", "dashboard": "d", "pools": pools}
    render_status(status, console)
    text = console.export_text()
    assert "Decode (0/0) idle" in text and f"Decode@{POOLS_APP} (1/1)" in text
    assert "Decode-0" in text


def test_during_a_rollout_both_apps_pools_are_live(serve: ServeApps) -> None:
    write_rollout(rollout(RolloutPhase.PAUSED))
    pools = collect_pools(APP, serve.apps, {})
    assert {p["app"] for p in pools} == {APP, POOLS_APP}
    assert not any(p["idle"] for p in pools)
    rollout_state.clear_rollout(APP)
    assert live_pools.idle_deployments(APP) == {}


def test_pools_app_names() -> None:
    assert live_pools.is_pools_app(APP, "pdserve-rollout")
    assert live_pools.is_pools_app(APP, "pdserve-rollout-12")
    assert not live_pools.is_pools_app(APP, "pdserve-rollouts")
    assert not live_pools.is_pools_app(APP, "pdserve")
    assert not live_pools.is_pools_app("other", "pdserve-rollout")


def test_a_board_that_does_not_answer_stops_the_scale_with_a_typed_error(
    serve: ServeApps, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(app: str) -> Any:
        def cordon(pools_app: str, deployment: str, on: bool) -> None:
            raise TimeoutError("no answer in 30 s")

        return cordon

    monkeypatch.setattr(scaling, "board_cordon", unreachable)
    del serve.apps[POOLS_APP]
    with pytest.raises(UnavailableError, match="stats board of app pdserve did not answer"):
        scaling.scale(APP, None, 2)
    assert serve.calls == []  # nothing resized
