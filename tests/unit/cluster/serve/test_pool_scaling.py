"""Pool sizes travel so that Serve's code version of the app never moves: checked with Serve's
own hash (``get_app_code_version``) over every PUT body pdserve sends for a resize, a pool at 0
and back, in the running app and in a stepped rollout's pools app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray.serve._private.application_state import get_app_code_version
from ray.serve.schema import ServeApplicationSchema

from cluster.ops.deploy_schema import deploy_schema, pools_app_schema, scaled_schema
from cluster.serve.config_file import load_cluster_config
from cluster.serve.pool_scaling import HOLD_POLICY, fixed_range, idle_range, pool_overrides
from core.config import ClusterConfig
from core.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

REPO_CONFIGS = Path(__file__).resolve().parents[4] / "configs"


def local() -> ClusterConfig:
    return load_cluster_config(REPO_CONFIGS / "local.yaml")


def version(body: dict[str, Any], app_name: str) -> str:
    (app,) = [a for a in body["applications"] if a["name"] == app_name]
    return get_app_code_version(ServeApplicationSchema(**app))


def sizes(body: dict[str, Any], app_name: str) -> dict[str, tuple[int, int]]:
    (app,) = [a for a in body["applications"] if a["name"] == app_name]
    return {
        d["name"]: (
            d["autoscaling_config"]["min_replicas"],
            d["autoscaling_config"]["max_replicas"],
        )
        for d in app["deployments"]
    }


def test_every_pool_is_sized_by_a_range_from_the_first_deploy() -> None:
    config = local()
    body = deploy_schema(config)
    assert sizes(body, "pdserve") == {"Prefill": (1, 1), "Decode": (1, 1)}
    assert all(d["autoscaling_config"]["policy"] == HOLD_POLICY for d in pool_overrides(config))


def test_resizing_to_0_and_back_keeps_the_running_apps_code_version() -> None:
    body = deploy_schema(local())
    before = version(body, "pdserve")
    for step in ({"Prefill": 3}, {"Decode": 0}, {"Prefill": 0}, {"Prefill": 1, "Decode": 2}):
        body = scaled_schema(body, "pdserve", step)
        assert version(body, "pdserve") == before, step
    assert sizes(body, "pdserve") == {"Prefill": (1, 1), "Decode": (2, 2)}


def test_a_pools_app_starts_idle_and_grows_without_a_new_code_version() -> None:
    config = local()
    body = {"applications": [pools_app_schema(config, "pdserve-rollout")]}
    before = version(body, "pdserve-rollout")
    assert sizes(body, "pdserve-rollout") == {"Prefill": (0, 1), "Decode": (0, 1)}
    for step in ({"Prefill": 1}, {"Decode": 1}, {"Decode": 0}):
        body = scaled_schema(body, "pdserve-rollout", step)
        assert version(body, "pdserve-rollout") == before, step


def test_autoscaled_pools_keep_their_range_in_code_and_refuse_0() -> None:
    mapping = local().model_dump(mode="json", exclude_unset=True)
    mapping["planner"] = {"mode": "load"}
    for role in ("prefill", "decode"):
        mapping[role].pop("num_replicas", None)
        mapping[role]["autoscaling"] = {"min_replicas": 1, "max_replicas": 2}
    body = deploy_schema(load_cluster_config(mapping))
    assert "deployments" not in body["applications"][-1]
    scaled = scaled_schema(body, "pdserve", {"Prefill": 2})
    assert scaled["applications"][-1]["deployments"] == [
        {"name": "Prefill", "num_replicas": 2, "autoscaling_config": None}
    ]
    with pytest.raises(ConfigError, match="autoscaled pool"):
        scaled_schema(body, "pdserve", {"Decode": 0})


def test_ranges_are_what_serve_accepts() -> None:
    from ray.serve.schema import DeploymentSchema

    for scaling in (fixed_range(3), idle_range(), idle_range(4)):
        DeploymentSchema(name="Decode", autoscaling_config=scaling)
