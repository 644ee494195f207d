"""``pdserve upgrade --stepped CONFIG`` starts a stepped rollout of an app;
``pdserve upgrade --pause | --resume | --rollback`` steer it.

:func:`start` takes a plan that replaces one model's pools (fixed sizes, kept by the new
config): it deploys the new version's pools as an app of their own (``<app>-rollout``, then
``<app>-rollout-2``, ... one per rollout, every pool at 0 replicas, reporting to the running
app's board and KV index), has the running app's ingress follow the model's old and new apps
(its ``user_config``, applied in place), records the rollout at step 0 and drives it. The old
version is the running app's own pools at first, and after a finished rollout the pools app it
left serving: an app is upgraded any number of times. A rollout that ends settles the apps: the
ingress follows only the version that serves, and the app of the other (held at 0) is deleted
(never the running app, whose pools then stay at 0).

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
from typing import Any

from cluster.ops import process_tree, rollout_state, run_state
from cluster.ops.board_calls import board_cordon, board_hand_off, board_snapshot
from cluster.ops.deploy_schema import pools_app_schema
from cluster.ops.live_pools import POOLS_APP_MARK
from cluster.ops.ray_session import attached
from cluster.ops.rest import ServeRest
from cluster.ops.rollout import RolloutDriver, RolloutTimeouts, Version
from cluster.ops.rollout_fleet import ServeRolloutFleet
from cluster.ops.rollout_state import RolloutPhase, RolloutState
from cluster.ops.upgrade_plan import UpgradePlan
from cluster.serve.in_place import in_place_user_config
from cluster.serve.pool_options import INGRESS_DEPLOYMENT
from cluster.serve.rollout_pools import FOLLOW_KEY, split_user_config
from core.config import ClusterConfig, ServedModel
from core.config.models import ROLES
from core.errors import ConfigError, UpgradeRefusedError

logger = logging.getLogger(__name__)


def rollout_app_name(app_name: str, generation: int) -> str:
    """The pools app of ``app_name``'s ``generation``-th rollout (names never repeat)."""
    name = f"{app_name}{POOLS_APP_MARK}"
    return name if generation == 1 else f"{name}-{generation}"


def serving_pools_app(app_name: str) -> str:
    """The app whose config ``app_name``'s pools run as a whole: the running app itself, or
    the pools app its last rollout left serving."""
    recorded = rollout_state.read_rollout(app_name)
    return app_name if recorded is None else recorded.serving_app


def ingress_user_config(app: dict[str, Any]) -> dict[str, Any] | None:
    """The Ingress deployment's ``user_config`` in Serve's app details ``app`` (None: unset)."""
    overrides: list[dict[str, Any]] = app.get("deployed_app_config", {}).get("deployments") or []
    ingress: dict[str, Any] = next(
        (d for d in overrides if d.get("name") == INGRESS_DEPLOYMENT), {}
    )
    user_config: dict[str, Any] | None = ingress.get("user_config")
    return user_config


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
    """Deploy the new version's pools of ``plan``'s one restarting model as an app of their
    own, have the ingress follow it beside the model's serving app, and drive the rollout
    (attached to Ray already)."""
    app_name = new.cluster.app_name
    served, sizes = _rollout_model(current, new, plan)
    previous = refuse_while_recorded(app_name)
    _, followed = split_user_config(_ingress_config(rest, app_name), app_name)
    old_app = _serving_app(app_name, served, previous, followed)
    generation = 1 if previous is None else previous.generation + 1
    new_app = rollout_app_name(app_name, generation)
    rest.deploy_app(pools_app_schema(new, new_app))
    rest.wait_running(new_app, timeouts.ready_timeout_s)
    followed[served.name] = [old_app, new_app]
    user_config = {**in_place_user_config(current), FOLLOW_KEY: followed}
    rest.reconfigure(app_name, INGRESS_DEPLOYMENT, user_config)
    state = RolloutState(
        app_name,
        served.scope,
        new_app,
        *sizes,
        0,
        RolloutPhase.PAUSED,
        old_app=old_app,
        generation=generation,
    )
    rollout_state.write_rollout(state)
    logger.info("rollout of %s: from %s to %s", served.name, old_app, new_app)
    return _drive_attached(state, rest, timeouts)


def refuse_while_recorded(
    app_name: str, *, redeploys: bool = False, resizes: bool = False
) -> RolloutState | None:
    """The recorded rollout of ``app_name`` (None: none), once it ended. Raises
    :class:`UpgradeRefusedError` while one is under way; and, when one left the pools serving
    from an app of their own, for an upgrade that ``redeploys`` the running app (whose own
    pools are held at 0) or ``resizes`` pools in place (they are not the running app's)."""
    recorded = rollout_state.read_rollout(app_name)
    if recorded is None:
        return None
    ended = recorded.phase in (RolloutPhase.DONE, RolloutPhase.ROLLED_BACK)
    serving = recorded.serving_app
    if ended and (serving == app_name or not (redeploys or resizes)):
        return recorded
    if not ended:
        why = "finish it (--resume) or roll it back (--rollback) first"
    elif redeploys:
        why = (
            f"the pools serve from {serving} now, so a plain upgrade (which redeploys "
            f"{app_name}, whose own pools are held at 0) is not supported; upgrade with --stepped"
        )
    else:
        why = f"the pools serve from {serving} now; resize them apart (pdserve scale)"
    raise UpgradeRefusedError(
        f"a rollout of {app_name} is recorded ({recorded.progress_line()}); {why}", param="app"
    )


def _ingress_config(rest: ServeRest, app_name: str) -> dict[str, Any] | None:
    return ingress_user_config(rest.app_details(app_name) or {})


def _serving_app(
    app_name: str,
    served: ServedModel,
    previous: RolloutState | None,
    followed: dict[str, list[str]],
) -> str:
    """The app whose pools serve ``served`` alone now: the one the last rollout of this model
    left serving, else the one the ingress follows for it, else the running app."""
    if previous is not None and previous.model == served.scope:
        return previous.serving_app
    apps = followed.get(served.name, [])
    return apps[0] if len(apps) == 1 else app_name


def _rollout_model(
    current: ClusterConfig, new: ClusterConfig, plan: UpgradePlan
) -> tuple[ServedModel, tuple[int, int]]:
    """The one model ``plan`` replaces and its pool sizes, which the new config must keep."""
    if current.planner.mode != "off":
        raise UpgradeRefusedError(
            f"a stepped rollout sets the pool sizes step by step; the {current.planner.mode} "
            "planner sizes them here (upgrade without --stepped, or set planner.mode: off first)",
            param="planner.mode",
        )
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
        {Version.OLD: state.old_app, Version.NEW: state.new_app},
        state.model,
        board_cordon(state.app_name),
        board_hand_off(state.app_name),
    )
    driver = RolloutDriver(fleet, rollout_state.write_rollout, rollout_state.take_pause, timeouts)
    final = driver.run(state)
    if final.phase in (RolloutPhase.DONE, RolloutPhase.ROLLED_BACK):
        _settle(rest, final, timeouts, fleet)
    return final


def _settle(
    rest: ServeRest, state: RolloutState, timeouts: RolloutTimeouts, fleet: ServeRolloutFleet
) -> None:
    """After ``state`` ended: the ingress follows only the app that serves, and the other one
    (at 0 replicas, followed by no model) is deleted, unless it is the running app (whose
    pools stay cordoned at 0)."""
    app_name = state.app_name
    serving = state.serving_app
    idle = state.old_app if serving == state.new_app else state.new_app
    fields, followed = split_user_config(_ingress_config(rest, app_name), app_name)
    for name, apps in list(followed.items()):
        if state.new_app not in apps:
            continue
        if serving == app_name:
            del followed[name]  # the running app's own pools serve it: no app to follow
        else:
            followed[name] = [serving]
    user_config = {**fields, FOLLOW_KEY: followed} if followed else fields
    rest.reconfigure(app_name, INGRESS_DEPLOYMENT, user_config)
    still_followed = {app for apps in followed.values() for app in apps}
    if idle != app_name and idle not in still_followed:
        rest.wait_running(app_name, timeouts.ready_timeout_s)  # the ingress let go of it
        rest.remove(idle)
        gone = Version.OLD if idle == state.old_app else Version.NEW
        for role in ROLES:
            fleet.cordon(gone, role, False)  # the board forgets the deleted app's pools
        logger.info("rollout of %s ended: %s serves, %s deleted", app_name, serving, idle)


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
