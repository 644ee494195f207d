"""The Serve side of the rollout seam over a fake REST API and board: a step is an in-place
``num_replicas`` update of one app's pool deployment; health joins Serve's replica states with
the stats board's fresh reports."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ray.serve.schema import DeploymentSchema

from cluster.ops.deploy_schema import scaled_schema
from cluster.ops.rollout import PoolHealth, Version
from cluster.ops.rollout_fleet import ServeRolloutFleet
from cluster.serve.config_file import load_cluster_config
from cluster.serve.pool_scaling import HOLD_POLICY, fixed_range, hold_at_lower_bound, pool_overrides

pytestmark = pytest.mark.timeout(30)

CONFIG = load_cluster_config(Path(__file__).resolve().parents[4] / "configs" / "local.yaml")


class FakeRest:
    def __init__(self, apps: dict[str, dict[str, Any]]) -> None:
        self.apps = apps
        self.scaled: list[tuple[str, dict[str, int]]] = []

    def app_details(self, app_name: str) -> dict[str, Any] | None:
        return self.apps.get(app_name)

    def scale(self, app_name: str, replicas: Mapping[str, int]) -> None:
        self.scaled.append((app_name, dict(replicas)))


def deployment(status: str, *replicas: tuple[str, str]) -> dict[str, Any]:
    return {"status": status, "replicas": [{"replica_id": i, "state": s} for i, s in replicas]}


def report(replica_id: str, **stats: int) -> dict[str, Any]:
    return {"replica_id": replica_id, "role": "decode", "stats": stats}


APPS = {Version.OLD: "pdserve", Version.NEW: "pdserve-next"}


def no_cordon(app: str, deployment: str, cordoned: bool) -> None:
    raise AssertionError(f"unexpected cordon of {app}/{deployment}")


def no_hand_off(app: str, deployment: str) -> None:
    raise AssertionError(f"unexpected handoff of {app}/{deployment}")


def test_a_cordon_or_handoff_names_the_versions_app_and_the_models_deployment() -> None:
    cordons: list[tuple[str, str, bool]] = []
    handoffs: list[tuple[str, str]] = []
    fleet = ServeRolloutFleet(
        FakeRest({}),
        dict,
        APPS,
        "qwen",
        lambda *c: cordons.append(c),
        lambda *h: handoffs.append(h),
    )
    fleet.cordon(Version.OLD, "decode", True)
    fleet.cordon(Version.NEW, "prefill", False)
    fleet.hand_off(Version.OLD, "decode")
    assert cordons == [("pdserve", "Decode-qwen", True), ("pdserve-next", "Prefill-qwen", False)]
    assert handoffs == [("pdserve", "Decode-qwen")]


def test_a_step_scales_one_deployment_of_the_versions_app() -> None:
    rest = FakeRest({})
    fleet = ServeRolloutFleet(rest, dict, APPS, "", no_cordon, no_hand_off)
    fleet.set_replicas(Version.NEW, "decode", 2)
    fleet.set_replicas(Version.OLD, "prefill", 0)
    assert rest.scaled == [("pdserve-next", {"Decode": 2}), ("pdserve", {"Prefill": 0})]


def test_a_scoped_model_scales_its_own_pool() -> None:
    rest = FakeRest({})
    ServeRolloutFleet(rest, dict, APPS, "qwen", no_cordon, no_hand_off).set_replicas(
        Version.NEW, "decode", 1
    )
    assert rest.scaled == [("pdserve-next", {"Decode-qwen": 1})]


def test_health_counts_running_replicas_that_report_and_their_requests() -> None:
    rest = FakeRest(
        {
            "pdserve": {"deployments": {"Decode": deployment(
                "UPDATING", ("a", "RUNNING"), ("b", "STOPPING"), ("c", "STARTING")
            )}},
        }
    )  # fmt: skip
    board = {"decode": [report("a", num_running=2, num_waiting=1), report("b", num_running=3)]}
    fleet = ServeRolloutFleet(rest, lambda: board, APPS, "", no_cordon, no_hand_off)
    assert fleet.health(Version.OLD, "decode") == PoolHealth(3, 1, 0, 6)


def test_a_running_replica_not_yet_on_the_board_is_not_healthy() -> None:
    rest = FakeRest(
        {"pdserve-next": {"deployments": {"Decode": deployment("HEALTHY", ("n", "RUNNING"))}}}
    )
    fleet = ServeRolloutFleet(rest, dict, APPS, "", no_cordon, no_hand_off)
    assert fleet.health(Version.NEW, "decode") == PoolHealth(1, 0, 0, 0)


def test_a_failed_deployment_counts_as_a_failed_replica() -> None:
    rest = FakeRest({"pdserve-next": {"deployments": {"Prefill": deployment("DEPLOY_FAILED")}}})
    fleet = ServeRolloutFleet(rest, dict, APPS, "", no_cordon, no_hand_off)
    assert fleet.health(Version.NEW, "prefill") == PoolHealth(0, 0, 1, 0)
    assert fleet.health(Version.OLD, "prefill") == PoolHealth(0, 0, 0, 0)  # app not deployed


def test_a_pool_set_to_0_is_held_by_an_idle_range_serve_accepts() -> None:
    current = {"applications": [{"name": "a", "deployments": pool_overrides(CONFIG)}]}
    current = scaled_schema(current, "a", {"Decode": 2})
    (app,) = scaled_schema(current, "a", {"Decode": 0, "Prefill": 1})["applications"]
    prefill, decode = app["deployments"]
    assert "num_replicas" not in decode
    idle = decode["autoscaling_config"]
    assert (idle["min_replicas"], idle["max_replicas"], idle["initial_replicas"]) == (0, 2, 0)
    assert idle["policy"] == HOLD_POLICY  # the one policy: the app's code version stays
    assert hold_at_lower_bound(SimpleNamespace(config=SimpleNamespace(min_replicas=0))) == (0, {})
    assert prefill["autoscaling_config"] == fixed_range(1)
    for entry in (decode, prefill):
        DeploymentSchema(**entry)  # what Serve validates the PUT with
    with pytest.raises(ValueError, match="greater than 0"):
        DeploymentSchema(name="Decode", num_replicas=0)  # why 0 is not a fixed count
