"""Which Serve app runs a served model's pools now, and which pools apps an app has.

A stepped rollout (``cluster.ops.upgrade_rollout``) runs one model's new pools as another Serve
app beside the running one (``<app>-rollout``, later ones ``<app>-rollout-2``, ...). While it
runs, is paused or failed half-way, both apps hold part of that model's pools and the rollout
owns their sizes; once it is done the new app serves the model (the running app's pools of it
sit at 0), and after a rollback the old one does again. ``pdserve scale``, ``status`` and
``down`` read that here, from the recorded rollout state (read only; the rollout writes it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cluster.ops.rollout_state import RolloutPhase, read_rollout
from cluster.serve.pool_options import pool_deployment_name
from core.errors import ConfigError

POOLS_APP_MARK = "-rollout"
"""A pools app's name is its running app's name, this, and ``-<n>`` from an app's second
rollout on (``cluster.ops.upgrade_rollout.rollout_app_name``)."""

_UNDER_WAY = {RolloutPhase.RUNNING, RolloutPhase.PAUSED, RolloutPhase.FAILED}


@dataclass(frozen=True)
class ModelPools:
    """Where one model's pools run: ``live`` serves it; ``idle`` holds its superseded pools at
    0 (None: no finished rollout of it)."""

    live: str
    idle: str | None = None


def is_pools_app(app_name: str, name: str) -> bool:
    """Whether ``name`` is the name of one of ``app_name``'s pools apps."""
    stem = f"{app_name}{POOLS_APP_MARK}"
    return name == stem or (name.startswith(f"{stem}-") and name[len(stem) + 1 :].isdigit())


def pools_apps(app_name: str, deployed: Iterable[str]) -> list[str]:
    """Every pools app of ``app_name``: those its rollout state records and every deployed app
    named like one (a rollout whose state is lost leaves its app running)."""
    rollout = read_rollout(app_name)
    recorded = [] if rollout is None else [rollout.new_app, rollout.old_app]
    named = [name for name in deployed if is_pools_app(app_name, name)]
    return sorted({name for name in [*recorded, *named] if name != app_name})


def model_pools(app_name: str, scope: str) -> ModelPools:
    """Where the pools of the model of ``scope`` run now; ConfigError while a rollout of that
    model is under way (its driver sets their sizes step by step)."""
    rollout = read_rollout(app_name)
    if rollout is None or rollout.model != scope:
        return ModelPools(app_name)
    if rollout.phase in _UNDER_WAY:
        raise ConfigError(
            f"a stepped rollout of {scope or app_name} is {rollout.phase.value} at step "
            f"{rollout.step}/{rollout.num_steps}: it sets the pool sizes; finish it "
            "(pdserve upgrade --resume) or roll it back (--rollback) first",
            param="scale",
        )
    old = rollout.old_app
    if rollout.phase is RolloutPhase.DONE:
        return ModelPools(rollout.new_app, idle=old)
    return ModelPools(old, idle=rollout.new_app)  # rolled back


def idle_deployments(app_name: str) -> dict[str, set[str]]:
    """``{app: deployments}`` holding a model's superseded pools at 0 after a finished
    rollout (empty while none is finished)."""
    rollout = read_rollout(app_name)
    if rollout is None or rollout.phase in _UNDER_WAY:
        return {}
    idle = model_pools(app_name, rollout.model).idle
    names = {pool_deployment_name(role, rollout.model) for role in ("prefill", "decode")}
    return {} if idle is None else {idle: names}
