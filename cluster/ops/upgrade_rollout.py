"""``pdserve upgrade --stepped CONFIG`` starts a stepped rollout of an app;
``pdserve upgrade --pause | --resume | --rollback`` steer it.

:func:`start` takes a plan that replaces one model's pools (fixed sizes, kept by the new
config): it deploys the new version's pools as a second app (``<app>-rollout``, every pool at 0
replicas, reporting to the running app's board and KV index), has the running app's ingress
follow that app (its ``user_config``, applied in place), records the rollout at step 0 and
drives it.

A rollout's state lives beside the run state (:mod:`~cluster.ops.rollout_state`). ``--pause``
asks the process driving it to stop after the step under way; ``--resume`` drives it on from
the step reached, and ``--rollback`` walks the same steps back until only the old version
serves. Both drive it from this process over Serve (:class:`~cluster.ops.rollout_fleet.
ServeRolloutFleet`, attached to the Ray that ``pdserve up`` recorded); while another process
still drives it they are refused, naming that process.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from cluster.ops import process_tree, rollout_state, run_state
from cluster.ops.deploy_schema import pools_app_schema
from cluster.ops.ray_session import attached
from cluster.ops.rest import ServeRest
from cluster.ops.rollout import RolloutDriver, RolloutTimeouts, Version
from cluster.ops.rollout_fleet import ServeRolloutFleet
from cluster.ops.rollout_state import RolloutPhase, RolloutState
from cluster.ops.status_view import board_snapshot
from cluster.ops.upgrade_plan import UpgradePlan
from cluster.serve.in_place import in_place_user_config
from cluster.serve.pool_options import INGRESS_DEPLOYMENT
from cluster.serve.rollout_pools import FOLLOW_KEY
from core.config import ClusterConfig, ServedModel
from core.errors import ConfigError, UpgradeRefusedError

logger = logging.getLogger(__name__)

ROLLOUT_APP_SUFFIX = "-rollout"
"""A stepped rollout's second app is the running app's name plus this."""


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


def start(
    rest: ServeRest,
    current: ClusterConfig,
    new: ClusterConfig,
    plan: UpgradePlan,
    timeouts: RolloutTimeouts,
) -> RolloutState:
    """Deploy the new version's pools of ``plan``'s one restarting model as a second app, have
    the ingress follow it, and drive the rollout (attached to Ray already)."""
    app_name = new.cluster.app_name
    served, sizes = _rollout_model(current, new, plan)
    refuse_while_recorded(app_name)
    new_app = f"{app_name}{ROLLOUT_APP_SUFFIX}"
    rest.deploy_app(pools_app_schema(new, new_app))
    rest.wait_running(new_app, timeouts.ready_timeout_s)
    user_config = {**in_place_user_config(current), FOLLOW_KEY: {served.name: new_app}}
    rest.reconfigure(app_name, INGRESS_DEPLOYMENT, user_config)
    state = RolloutState(app_name, served.scope, new_app, *sizes, 0, RolloutPhase.PAUSED)
    rollout_state.write_rollout(state)
    logger.info("rollout of %s: its new pools run in %s", served.name, new_app)
    return _drive_attached(state, rest, timeouts)


def refuse_while_recorded(app_name: str) -> None:
    """Raise :class:`UpgradeRefusedError` while a rollout of ``app_name`` is recorded that did
    not roll back: the running app's config no longer says what serves."""
    recorded = rollout_state.read_rollout(app_name)
    if recorded is None or recorded.phase is RolloutPhase.ROLLED_BACK:
        return
    if recorded.phase is RolloutPhase.DONE:
        why = (
            "its new pools serve from their own app now; upgrading from there is not supported yet"
        )
    else:
        why = "finish it (--resume) or roll it back (--rollback) first"
    raise UpgradeRefusedError(
        f"a rollout of {app_name} is recorded ({recorded.progress_line()}); {why}", param="app"
    )


def _rollout_model(
    current: ClusterConfig, new: ClusterConfig, plan: UpgradePlan
) -> tuple[ServedModel, tuple[int, int]]:
    """The one model ``plan`` replaces and its pool sizes, which the new config must keep."""
    restarting = [m.name for m in plan.models if m.restarts]
    if len(restarting) != 1:
        raise UpgradeRefusedError(
            f"a stepped rollout replaces one model's pools; this plan replaces {restarting}",
            param="models",
        )
    others = (*plan.ingress_fields, *plan.redeploy_fields)
    if others:
        raise UpgradeRefusedError(
            f"a stepped rollout changes pools only; {', '.join(others)} changed too (upgrade "
            "them apart)",
            param=others[0].split(".")[0],
        )
    old = {m.name: m for m in current.served_models()}[restarting[0]]
    served = {m.name: m for m in new.served_models()}[restarting[0]]
    sizes = []
    for role in ("prefill", "decode"):
        before, after = old.pool_for(role).num_replicas, served.pool_for(role).num_replicas
        if before is None or after is None or before != after:
            raise UpgradeRefusedError(
                f"model {served.name}: a stepped rollout keeps fixed pool sizes; {role} runs "
                f"{before}, the new config asks {after} (resize apart with pdserve scale)",
                param=f"{served.field_path}{role}.num_replicas",
            )
        sizes.append(after)
    return served, (sizes[0], sizes[1])


def _drive(state: RolloutState, timeouts: RolloutTimeouts) -> RolloutState:
    url, address, auth_mode = run_state.target(state.app_name, None, "auto")
    with attached(address, auth_mode=auth_mode):
        return _drive_attached(state, ServeRest(url), timeouts)


def _drive_attached(
    state: RolloutState, rest: ServeRest, timeouts: RolloutTimeouts
) -> RolloutState:
    fleet = ServeRolloutFleet(
        rest,
        lambda: board_snapshot(state.app_name),
        {Version.OLD: state.app_name, Version.NEW: state.new_app},
        state.model,
    )
    driver = RolloutDriver(fleet, rollout_state.write_rollout, rollout_state.take_pause, timeouts)
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
