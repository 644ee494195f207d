"""``pdserve upgrade --stepped CONFIG`` against a fake Serve REST API and fleet: a new
checkpoint deploys the new pools as a second app, has the ingress follow it and walks every
step; what a stepped rollout cannot do is refused before anything moves, and so is one while
another is under way; an in-place upgrade keeps the followed apps, and the running config
ignores them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.ops import rollout_state, upgrade_rollout
from cluster.ops import upgrade as upgrade_module
from cluster.ops.rollout import RolloutTimeouts
from cluster.ops.rollout_state import RolloutPhase, RolloutState
from cluster.serve.config_file import config_to_mapping, load_cluster_config
from cluster.serve.in_place import in_place_user_config
from cluster.serve.rollout_pools import FOLLOW_KEY
from core.config import ClusterConfig
from core.errors import UpgradeRefusedError
from tests.unit.cluster.ops.upgrade_fakes import FakeRest, InstantFleet, offline_upgrade

pytestmark = pytest.mark.timeout(30)

RUNNING = load_cluster_config(
    {
        "model": {"name": "/models/a", "served_name": "llama"},
        "prefill": {"num_replicas": 1},
        "decode": {"num_replicas": 2},
    }
)
FAST = RolloutTimeouts(poll_s=0.0)


@pytest.fixture
def rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRest:
    fake = FakeRest({"deployed_app_config": {"args": {"config": config_to_mapping(RUNNING)}}})
    offline_upgrade(upgrade_module, tmp_path, monkeypatch, fake)
    monkeypatch.setattr(upgrade_rollout, "ServeRolloutFleet", lambda *args: InstantFleet())
    return fake


def new(**changes: Any) -> ClusterConfig:
    return load_cluster_config({**config_to_mapping(RUNNING), **changes})


NEW_CHECKPOINT = {"model": {"name": "/models/b", "served_name": "llama"}}


def test_a_stepped_upgrade_deploys_a_second_app_and_walks_every_step(rest: FakeRest) -> None:
    plan = upgrade_module.upgrade(new(**NEW_CHECKPOINT), stepped=True, timeouts=FAST)
    assert plan.restarts
    (deploy, wait, reconfigure, settle) = rest.calls
    assert deploy[0] == "deploy_app" and deploy[1]["name"] == "pdserve-rollout"
    assert deploy[1]["import_path"] == "cluster.app:build_pools_app"
    assert deploy[1]["route_prefix"] is None
    assert deploy[1]["args"]["config"]["model"]["name"] == "/models/b"
    assert wait == ("wait_running", "pdserve-rollout")
    follow = {"llama": ["pdserve", "pdserve-rollout"]}
    assert reconfigure == (
        "reconfigure",
        ("Ingress", {**in_place_user_config(RUNNING), FOLLOW_KEY: follow}),
    )
    follow = {"llama": ["pdserve-rollout"]}  # done: the running app's pools stay at 0
    assert settle == (
        "reconfigure",
        ("Ingress", {**in_place_user_config(RUNNING), FOLLOW_KEY: follow}),
    )
    done = rollout_state.read_rollout("pdserve")
    assert done is not None and done.phase is RolloutPhase.DONE and done.step == 3
    assert (done.num_prefill, done.num_decode, done.new_app) == (1, 2, "pdserve-rollout")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({**NEW_CHECKPOINT, "decode": {"num_replicas": 3}},
         "keeps fixed pool sizes; decode runs 2"),
        ({**NEW_CHECKPOINT, "disaggregation": {"local_prefill_threshold_tokens": 7}},
         "changes pools only; disaggregation changed too"),
    ],
)  # fmt: skip
def test_what_a_stepped_rollout_cannot_do_is_refused_before_anything_moves(
    rest: FakeRest, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(UpgradeRefusedError, match=message):
        upgrade_module.upgrade(new(**changes), stepped=True, timeouts=FAST)
    assert rest.calls == [] and rollout_state.read_rollout("pdserve") is None


def test_a_rollout_under_way_blocks_another(rest: FakeRest) -> None:
    paused = RolloutState("pdserve", "", "pdserve-rollout", 1, 2, 1, RolloutPhase.PAUSED)
    rollout_state.write_rollout(paused)
    with pytest.raises(UpgradeRefusedError, match="--resume"):
        upgrade_module.upgrade(new(**NEW_CHECKPOINT), stepped=True, timeouts=FAST)
    with pytest.raises(UpgradeRefusedError, match="--resume"):  # nor a resize in place
        upgrade_module.upgrade(new(decode={"num_replicas": 3}))
    assert rest.calls == []


def test_without_stepped_a_new_checkpoint_still_redeploys(rest: FakeRest) -> None:
    rest.deploy = lambda config: rest.calls.append(("deploy", config))  # type: ignore[attr-defined]
    upgrade_module.upgrade(new(**NEW_CHECKPOINT))
    assert [name for name, _ in rest.calls] == ["deploy", "wait_running"]


def test_an_in_place_upgrade_keeps_the_followed_apps(rest: FakeRest) -> None:
    followed = {FOLLOW_KEY: {"llama": "pdserve-rollout"}}  # the older shape: it still reads
    assert rest.app is not None
    rest.app["deployed_app_config"]["deployments"] = [
        {"name": "Ingress", "user_config": {**in_place_user_config(RUNNING), **followed}}
    ]
    target = new(routing={"migration_limit": 5})
    assert upgrade_module.running_config(rest.app, "pdserve") == RUNNING
    upgrade_module.upgrade(target)
    followed = {FOLLOW_KEY: {"llama": ["pdserve", "pdserve-rollout"]}}
    assert rest.calls == [
        ("reconfigure", ("Ingress", {**in_place_user_config(target), **followed}))
    ]
