"""``pdserve upgrade`` against a fake Serve REST API: the running config is read from the app's
args, a new checkpoint redeploys, a resize scales in place, routing knobs and planner
thresholds reconfigure the ingress alone, a change replicas read is refused changing nothing, a
dry run changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.ops import upgrade as upgrade_module
from cluster.serve.config_file import config_to_mapping, load_cluster_config
from cluster.serve.in_place import in_place_user_config
from core.config import ClusterConfig
from core.errors import UnavailableError, UpgradeRefusedError
from tests.unit.cluster.ops.upgrade_fakes import FakeRest, offline_upgrade

pytestmark = pytest.mark.timeout(10)

RUNNING = load_cluster_config(
    {
        "model": {"name": "/models/a", "served_name": "llama"},
        "prefill": {"num_replicas": 1},
        "decode": {"num_replicas": 2},
    }
)


@pytest.fixture
def rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRest:
    fake = FakeRest({"deployed_app_config": {"args": {"config": config_to_mapping(RUNNING)}}})
    offline_upgrade(upgrade_module, tmp_path, monkeypatch, fake)
    return fake


def new(**changes: Any) -> ClusterConfig:
    return load_cluster_config({**config_to_mapping(RUNNING), **changes})


def test_a_new_checkpoint_redeploys_the_app(rest: FakeRest) -> None:
    target = new(model={"name": "/models/b", "served_name": "llama"})
    plan = upgrade_module.upgrade(target)
    assert plan.restarts
    assert rest.calls == [("deploy", target), ("wait_running", "pdserve")]


def test_a_dry_run_changes_nothing(rest: FakeRest) -> None:
    plan = upgrade_module.upgrade(new(engine={"block_size": 32}), dry_run=True)
    assert plan.models[0].restart_reasons == ("engine",)
    assert rest.calls == []


def test_a_resize_scales_in_place(rest: FakeRest) -> None:
    upgrade_module.upgrade(new(decode={"num_replicas": 3}))
    assert rest.calls == [("scale", {"Decode": 3})]


def test_a_routing_and_planner_change_reconfigures_the_ingress_alone(rest: FakeRest) -> None:
    target = new(routing={"policy": "hot_prefix"}, planner={"max_step": 3})
    plan = upgrade_module.upgrade(target)
    assert plan.ingress_fields == ("routing.policy", "planner.max_step") and not plan.restarts
    assert rest.calls == [("reconfigure", ("Ingress", in_place_user_config(target)))]
    assert rest.app is not None  # Serve keeps the args and records the user_config:
    rest.app["deployed_app_config"]["deployments"] = [
        {"name": "Ingress", "user_config": in_place_user_config(target)}
    ]
    assert upgrade_module.running_config(rest.app, "pdserve") == target  # read back


def test_a_change_replicas_read_is_refused_naming_it(rest: FakeRest) -> None:
    with pytest.raises(UpgradeRefusedError, match="kv_index_stride changed") as info:
        upgrade_module.upgrade(new(routing={"policy": "hot_prefix", "kv_index_stride": 2}))
    assert info.value.param == "routing"
    assert rest.calls == []


def test_an_app_that_is_not_running_is_named(rest: FakeRest) -> None:
    rest.app = None
    with pytest.raises(UnavailableError, match="not deployed"):
        upgrade_module.upgrade(new())


def test_ingress_fields_are_applied_in_place_with_a_resize(rest: FakeRest) -> None:
    target = new(routing={"migration_limit": 0}, decode={"num_replicas": 3})
    plan = upgrade_module.upgrade(target)
    assert plan.ingress_fields == ("routing.migration_limit",) and not plan.restarts
    assert rest.calls == [
        ("reconfigure", ("Ingress", in_place_user_config(target))),
        ("scale", {"Decode": 3}),
    ]


def test_the_running_config_includes_what_was_applied_in_place(rest: FakeRest) -> None:
    applied = new(routing={"migration_limit": 0})
    assert rest.app is not None
    rest.app["deployed_app_config"]["deployments"] = [
        {"name": "Ingress", "user_config": in_place_user_config(applied)}
    ]
    assert upgrade_module.upgrade(applied).empty
    assert upgrade_module.upgrade(new()).ingress_fields == ("routing.migration_limit",)
