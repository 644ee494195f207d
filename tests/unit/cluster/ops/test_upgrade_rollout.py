"""``pdserve upgrade --pause | --resume | --rollback`` over a recorded rollout: pause only a
driven one, never steer one another live process drives, resume and roll back over the fleet
(a fake standing in for Serve), and the CLI takes a config or exactly one flag."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cluster.ops import rollout_state, upgrade_rollout
from cluster.ops.cli import app as cli_app
from cluster.ops.rollout import RolloutTimeouts, Version
from cluster.ops.rollout_state import RolloutPhase, RolloutState
from core.errors import ConfigError
from tests.unit.cluster.ops.upgrade_fakes import FakeRest, InstantFleet, offline_upgrade

pytestmark = pytest.mark.timeout(30)
APP = "roll"


@pytest.fixture
def rest() -> FakeRest:
    return FakeRest({})


@pytest.fixture
def fleets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rest: FakeRest) -> list[InstantFleet]:
    made: list[InstantFleet] = []

    def fleet(
        rest: Any, board: Any, apps: dict[Version, str], scope: str, cordon: Any, hand_off: Any
    ) -> InstantFleet:
        made.append(InstantFleet(apps, scope))
        return made[-1]

    offline_upgrade(upgrade_rollout, tmp_path, monkeypatch, rest)
    monkeypatch.setattr(upgrade_rollout, "ServeRolloutFleet", fleet)
    return made


def record(step: int, phase: RolloutPhase, driver_pid: int | None = None) -> RolloutState:
    state = RolloutState(APP, "m", f"{APP}-next", 2, 2, step, phase, driver_pid=driver_pid)
    rollout_state.write_rollout(state)
    return state


def gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_nothing_recorded_is_a_typed_error(fleets: list[InstantFleet]) -> None:
    with pytest.raises(ConfigError, match="no rollout of roll recorded"):
        upgrade_rollout.pause(APP)
    with pytest.raises(ConfigError, match="no rollout"):
        upgrade_rollout.resume(APP, RolloutTimeouts())


def test_pause_asks_the_live_driver(fleets: list[InstantFleet]) -> None:
    record(1, RolloutPhase.RUNNING, driver_pid=os.getpid())
    upgrade_rollout.pause(APP)
    assert rollout_state.take_pause(APP)


def test_pause_refuses_a_rollout_nobody_drives(fleets: list[InstantFleet]) -> None:
    record(1, RolloutPhase.PAUSED)
    with pytest.raises(ConfigError, match="not running \\(paused\\)"):
        upgrade_rollout.pause(APP)
    record(1, RolloutPhase.RUNNING, driver_pid=gone_pid())
    with pytest.raises(ConfigError, match="not running"):
        upgrade_rollout.pause(APP)


def test_a_rollout_another_process_drives_is_not_steered(fleets: list[InstantFleet]) -> None:
    record(1, RolloutPhase.RUNNING, driver_pid=os.getppid())
    with pytest.raises(ConfigError, match=f"driven by process {os.getppid()}"):
        upgrade_rollout.rollback(APP, RolloutTimeouts())
    assert not fleets


def test_resume_finishes_from_the_step_reached(fleets: list[InstantFleet], rest: FakeRest) -> None:
    record(2, RolloutPhase.RUNNING, driver_pid=gone_pid())  # its driver died mid-walk
    rollout_state.request_pause(APP)  # asked of that dead driver: not carried over
    done = upgrade_rollout.resume(APP, RolloutTimeouts(poll_s=0.0))
    assert done.phase is RolloutPhase.DONE and done.step == 4
    (fleet,) = fleets
    assert fleet.apps == {Version.OLD: APP, Version.NEW: f"{APP}-next"} and fleet.scope == "m"
    assert fleet.sizes[(Version.NEW, "decode")] == 2 and fleet.sizes[(Version.OLD, "decode")] == 0
    assert rollout_state.read_rollout(APP) == done
    assert ("remove", APP) not in rest.calls  # the running app's pools stay, at 0


def test_rollback_returns_every_replica_to_the_old_version(
    fleets: list[InstantFleet], rest: FakeRest
) -> None:
    record(3, RolloutPhase.FAILED)
    back = upgrade_rollout.rollback(APP, RolloutTimeouts(poll_s=0.0))
    assert back.phase is RolloutPhase.ROLLED_BACK and back.step == 0 and back.rolling_back
    (fleet,) = fleets
    assert fleet.sizes[(Version.OLD, "prefill")] == 2 and fleet.sizes[(Version.NEW, "prefill")] == 0
    assert rest.calls[-1] == ("remove", f"{APP}-next")  # its idle app is deleted


@pytest.mark.parametrize(
    "args",
    [["upgrade"], ["upgrade", "--pause", "--resume"], ["upgrade", "x.yaml", "--rollback"],
     ["upgrade", "--resume", "--dry-run"]],
)  # fmt: skip
def test_the_cli_takes_a_config_or_one_rollout_flag(
    args: list[str], fleets: list[InstantFleet]
) -> None:
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 2
    assert "give a new config, or one of --pause, --resume, --rollback" in result.output


def test_the_cli_pauses(fleets: list[InstantFleet]) -> None:
    record(1, RolloutPhase.RUNNING, driver_pid=os.getpid())
    result = CliRunner().invoke(cli_app, ["upgrade", "--pause", "--app", APP])
    assert result.exit_code == 0, result.output
    assert "pausing after the step under way: step 1/4" in result.output
    assert rollout_state.take_pause(APP)
