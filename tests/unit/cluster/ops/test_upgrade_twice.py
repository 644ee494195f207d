"""A second stepped upgrade after a finished rollout, against a fake Serve REST API and fleet:
it plans from what serves (the pools app the first rollout left), deploys the next pools app
under a new name, walks from the previous pools app to it while the ingress follows both, and
ends following only the new one with the superseded app deleted; a rollback returns to the
previous pools app; a plain upgrade or an in-place resize from there is refused; state files
written before these fields existed still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.ops import rollout_state, upgrade_rollout
from cluster.ops import upgrade as upgrade_module
from cluster.ops.rollout import RolloutTimeouts, Version
from cluster.ops.rollout_state import RolloutPhase, RolloutState
from cluster.serve.config_file import config_to_mapping, load_cluster_config
from cluster.serve.in_place import in_place_user_config
from cluster.serve.rollout_pools import FOLLOW_KEY
from core.config import ClusterConfig
from core.errors import UnavailableError, UpgradeRefusedError
from tests.unit.cluster.ops.upgrade_fakes import FakeRest, InstantFleet, offline_upgrade

pytestmark = pytest.mark.timeout(30)

FAST = RolloutTimeouts(poll_s=0.0)
SIZES = {"prefill": {"num_replicas": 1}, "decode": {"num_replicas": 2}}


def config(checkpoint: str, **changes: Any) -> ClusterConfig:
    model = {"name": f"/models/{checkpoint}", "served_name": "llama"}
    return load_cluster_config({"model": model, **SIZES, **changes})


FIRST, SECOND, THIRD = config("a"), config("b"), config("c")


def deployed(cfg: ClusterConfig) -> dict[str, Any]:
    return {"deployed_app_config": {"args": {"config": config_to_mapping(cfg)}}}


def following(*apps: str) -> dict[str, Any]:
    """The ingress's ``user_config`` while it follows ``apps`` for the model."""
    return {**in_place_user_config(FIRST), FOLLOW_KEY: {"llama": list(apps)}}


def follows(*apps: str) -> tuple[str, tuple[str, dict[str, Any]]]:
    return ("reconfigure", ("Ingress", following(*apps)))


@pytest.fixture
def fleets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[InstantFleet]:
    made: list[InstantFleet] = []

    def fleet(
        rest: Any, board: Any, apps: dict[Version, str], scope: str, cordon: Any, hand_off: Any
    ) -> InstantFleet:
        made.append(InstantFleet(apps, scope))
        return made[-1]

    monkeypatch.setattr(upgrade_rollout, "ServeRolloutFleet", fleet)
    return made


@pytest.fixture
def rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fleets: list[InstantFleet]) -> FakeRest:
    """The cluster after one finished stepped rollout from FIRST to SECOND."""
    fake = FakeRest(deployed(FIRST), apps={"pdserve-rollout": deployed(SECOND)})
    offline_upgrade(upgrade_module, tmp_path, monkeypatch, fake)
    offline_upgrade(upgrade_rollout, tmp_path, monkeypatch, fake)
    fake.reconfigure("pdserve", "Ingress", following("pdserve-rollout"))
    done = RolloutState("pdserve", "", "pdserve-rollout", 1, 2, 3, RolloutPhase.DONE)
    rollout_state.write_rollout(done)
    fake.calls.clear()
    return fake


def test_a_second_rollout_goes_from_the_first_ones_app_to_a_new_one(
    rest: FakeRest, fleets: list[InstantFleet]
) -> None:
    plan = upgrade_module.upgrade(THIRD, stepped=True, timeouts=FAST)
    assert plan.models[0].restarts
    (deploy, wait, follow_both, follow_new, settled, remove) = rest.calls
    assert deploy[0] == "deploy_app" and deploy[1]["name"] == "pdserve-rollout-2"
    assert deploy[1]["args"]["config"]["model"]["name"] == "/models/c"
    assert wait == ("wait_running", "pdserve-rollout-2")
    assert follow_both == follows("pdserve-rollout", "pdserve-rollout-2")
    assert follow_new == follows("pdserve-rollout-2")
    assert settled == ("wait_running", "pdserve")  # the ingress let go of the old app first
    assert remove == ("remove", "pdserve-rollout")
    (fleet,) = fleets
    assert fleet.apps == {Version.OLD: "pdserve-rollout", Version.NEW: "pdserve-rollout-2"}
    assert fleet.sizes[(Version.OLD, "decode")] == 0 and fleet.sizes[(Version.NEW, "decode")] == 2
    done = rollout_state.read_rollout("pdserve")
    assert done is not None and done.phase is RolloutPhase.DONE
    assert (done.old_app, done.new_app, done.generation) == (
        "pdserve-rollout",
        "pdserve-rollout-2",
        2,
    )
    assert done.progress_line().endswith("(done), pdserve-rollout -> pdserve-rollout-2")
    assert upgrade_rollout.serving_pools_app("pdserve") == "pdserve-rollout-2"


def test_a_third_rollout_plans_from_the_second_and_names_its_app_anew(
    rest: FakeRest, fleets: list[InstantFleet]
) -> None:
    upgrade_module.upgrade(THIRD, stepped=True, timeouts=FAST)
    rest.apps["pdserve-rollout-2"] = deployed(THIRD)
    rest.calls.clear()
    assert upgrade_module.upgrade(THIRD, stepped=True, timeouts=FAST).empty
    assert upgrade_module.upgrade(FIRST, dry_run=True).models[0].restarts
    upgrade_module.upgrade(config("d"), stepped=True, timeouts=FAST)
    assert rest.calls[0][1]["name"] == "pdserve-rollout-3"
    assert ("remove", "pdserve-rollout-2") in rest.calls
    assert fleets[-1].apps[Version.OLD] == "pdserve-rollout-2"


def test_planning_reads_the_config_that_serves(rest: FakeRest) -> None:
    assert upgrade_module.upgrade(SECOND, stepped=True, timeouts=FAST).empty
    assert upgrade_module.upgrade(THIRD, dry_run=True).models[0].restart_reasons == ("model",)
    assert rest.calls == []


@pytest.mark.parametrize(
    ("target", "stepped", "message"),
    [(THIRD, False, "upgrade with --stepped"),
     (config("b", decode={"num_replicas": 3}), False, "resize them apart"),
     (config("b", decode={"num_replicas": 3}), True, "resize them apart")],
)  # fmt: skip
def test_what_would_touch_the_idle_running_pools_is_refused(
    rest: FakeRest, target: ClusterConfig, stepped: bool, message: str
) -> None:
    with pytest.raises(UpgradeRefusedError, match=message):
        upgrade_module.upgrade(target, stepped=stepped, timeouts=FAST)
    assert rest.calls == []


@pytest.mark.parametrize("stepped", [True, False])
def test_an_ingress_field_is_applied_in_place_keeping_the_followed_app(
    rest: FakeRest, stepped: bool
) -> None:
    target = config("b", routing={"migration_limit": 5})
    upgrade_module.upgrade(target, stepped=stepped, timeouts=FAST)
    follow = {FOLLOW_KEY: {"llama": ["pdserve-rollout"]}}
    assert rest.calls == [("reconfigure", ("Ingress", {**in_place_user_config(target), **follow}))]


def test_rolling_back_a_second_rollout_returns_to_the_first_ones_app(
    rest: FakeRest, fleets: list[InstantFleet]
) -> None:
    rest.reconfigure("pdserve", "Ingress", following("pdserve-rollout", "pdserve-rollout-2"))
    paused = RolloutState(
        "pdserve", "", "pdserve-rollout-2", 1, 2, 1, RolloutPhase.PAUSED,
        old_app="pdserve-rollout", generation=2,
    )  # fmt: skip
    rollout_state.write_rollout(paused)
    rest.calls.clear()
    back = upgrade_rollout.rollback("pdserve", FAST)
    assert back.phase is RolloutPhase.ROLLED_BACK and back.serving_app == "pdserve-rollout"
    assert rest.calls == [
        follows("pdserve-rollout"),
        ("wait_running", "pdserve"),
        ("remove", "pdserve-rollout-2"),
    ]
    assert fleets[-1].sizes[(Version.OLD, "prefill")] == 1
    with pytest.raises(UpgradeRefusedError, match="serve from pdserve-rollout now"):
        upgrade_module.upgrade(THIRD)  # still a pools app: plain upgrades stay refused
    upgrade_module.upgrade(THIRD, stepped=True, timeouts=FAST)
    deployed_apps = [entry["name"] for call, entry in rest.calls if call == "deploy_app"]
    assert deployed_apps == ["pdserve-rollout-3"]  # names never repeat


def test_rolling_back_a_first_rollout_follows_nothing(
    rest: FakeRest, fleets: list[InstantFleet]
) -> None:
    rest.reconfigure("pdserve", "Ingress", following("pdserve", "pdserve-rollout"))
    paused = RolloutState("pdserve", "", "pdserve-rollout", 1, 2, 2, RolloutPhase.FAILED)
    rollout_state.write_rollout(paused)
    rest.calls.clear()
    upgrade_rollout.rollback("pdserve", FAST)
    assert rest.calls == [
        ("reconfigure", ("Ingress", in_place_user_config(FIRST))),
        ("wait_running", "pdserve"),
        ("remove", "pdserve-rollout"),
    ]
    assert upgrade_rollout.serving_pools_app("pdserve") == "pdserve"


def test_a_state_file_from_before_reads_as_a_first_rollout_of_the_running_app(
    rest: FakeRest,
) -> None:
    path = rollout_state.rollout_path("pdserve")
    plain = json.loads(path.read_text())
    del plain["old_app"], plain["generation"]
    path.write_text(json.dumps(plain))
    state = rollout_state.read_rollout("pdserve")
    assert state is not None and (state.old_app, state.generation) == ("pdserve", 1)
    assert state.progress_line() == "step 3/3: Prefill 0 old + 1 new, Decode 0 old + 2 new (done)"


def test_a_missing_serving_pools_app_is_named(rest: FakeRest) -> None:
    with pytest.raises(UnavailableError, match="'pdserve-rollout', whose pools serve"):
        upgrade_module.running_config(rest.app, "pdserve", None, "pdserve-rollout")
    with pytest.raises(UpgradeRefusedError, match="'pdserve-rollout' was not deployed by pdserve"):
        upgrade_module.running_config(rest.app, "pdserve", {}, "pdserve-rollout")
    assert upgrade_module.running_config(rest.app, "pdserve", None, "pdserve") == FIRST
