"""``pdserve upgrade --pause | --resume | --rollback``: steer the stepped rollout of an app.

A rollout's state lives beside the run state (:mod:`~cluster.ops.rollout_state`). ``--pause``
asks the process driving it to stop after the step under way; ``--resume`` drives it on from
the step reached, and ``--rollback`` walks the same steps back until only the old version
serves. Both drive it from this process over Serve (:class:`~cluster.ops.rollout_fleet.
ServeRolloutFleet`, attached to the Ray that ``pdserve up`` recorded); while another process
still drives it they are refused, naming that process.
"""

from __future__ import annotations

from dataclasses import replace

from cluster.ops import process_tree, rollout_state, run_state
from cluster.ops.ray_session import attached
from cluster.ops.rest import ServeRest
from cluster.ops.rollout import RolloutDriver, RolloutTimeouts, Version
from cluster.ops.rollout_fleet import ServeRolloutFleet
from cluster.ops.rollout_state import RolloutPhase, RolloutState
from cluster.ops.status_view import board_snapshot
from core.errors import ConfigError


def pause(app_name: str) -> RolloutState:
    """Ask the driver of ``app_name``'s rollout to stop after its current step."""
    state = _recorded(app_name)
    if state.phase is not RolloutPhase.RUNNING or not _driven(state):
        raise ConfigError(
            f"the rollout of {app_name} is not running ({state.phase.value}); nothing to pause",
            param="pause",
        )
    rollout_state.request_pause(app_name)
    return state


def resume(app_name: str, timeouts: RolloutTimeouts) -> RolloutState:
    """Drive ``app_name``'s rollout on, in its direction, from the step reached."""
    return _drive(_steerable(app_name), timeouts)


def rollback(app_name: str, timeouts: RolloutTimeouts) -> RolloutState:
    """Walk ``app_name``'s rollout back, step by step, until only the old version serves."""
    return _drive(replace(_steerable(app_name), rolling_back=True), timeouts)


def _drive(state: RolloutState, timeouts: RolloutTimeouts) -> RolloutState:
    url, address, auth_mode = run_state.target(state.app_name, None, "auto")
    with attached(address, auth_mode=auth_mode):
        fleet = ServeRolloutFleet(
            ServeRest(url),
            lambda: board_snapshot(state.app_name),
            {Version.OLD: state.app_name, Version.NEW: state.new_app},
            state.model,
        )
        driver = RolloutDriver(
            fleet, rollout_state.write_rollout, rollout_state.take_pause, timeouts
        )
        return driver.run(state)


def _recorded(app_name: str) -> RolloutState:
    state = rollout_state.read_rollout(app_name)
    if state is None:
        raise ConfigError(f"no rollout of {app_name} recorded", param="app")
    return state


def _steerable(app_name: str) -> RolloutState:
    """The recorded rollout, unless another live process drives it."""
    state = _recorded(app_name)
    if state.phase is RolloutPhase.RUNNING and _driven(state):
        raise ConfigError(
            f"the rollout of {app_name} is being driven by process {state.driver_pid}; "
            "pause it first (pdserve upgrade --pause)",
            param="app",
        )
    rollout_state.take_pause(app_name)  # a pause asked of a driver that is gone
    return state


def _driven(state: RolloutState) -> bool:
    """Whether the process recorded as driving ``state`` still runs."""
    return state.driver_pid is not None and process_tree.is_running(state.driver_pid)
