"""``pdserve upgrade CONFIG``: move a running cluster to a new YAML.

It reads the config the app runs (Serve keeps it as the app's ``args``; after a stepped rollout,
the args of the pools app the rollout left serving), plans the change
(:mod:`~cluster.ops.upgrade_plan`: refused, in place, or replacing a model's pools) and applies
what it can through Serve's own deployment updates: a plan that only resizes pools is a
:meth:`~cluster.ops.rest.ServeRest.scale` (nothing restarts); a plan that replaces pools is a
redeploy of the app from the new config. Serve's code version covers the app's args, so that
redeploy replaces every deployment of the app (not only the changed ones), replica by replica
while the old replicas serve — pairing by KV fingerprint keeps the two versions' prefill and
decode apart meanwhile. With ``stepped`` (``pdserve upgrade --stepped``) such a plan runs
instead as a stepped rollout (:mod:`~cluster.ops.upgrade_rollout`): the new pools go up as an
app of their own and replace the old ones replica by replica, keeping the P:D ratio. Once a
rollout left the pools in such an app, only ``--stepped`` replaces them further (a redeploy is
refused: it would rebuild the running app, whose own pools are held at 0). The fields
``cluster.serve.in_place`` lists (what the ingress reads, the routers' policy and hot-prefix
settings, the planner's thresholds) are applied in place: the new values become the Ingress
deployment's ``user_config``, Serve calls its ``reconfigure``, and the ingress hands them on to
its routers and to the planner; no replica restarts. What replicas read (the KV index's shards
and stride) and the planner's mode and profile take a redeploy, which restarts every replica:
alone, such a change is refused naming the fields, and nothing changes (they ride along with an
upgrade that replaces pools anyway).
"""

from __future__ import annotations

import logging
from typing import Any

from cluster.ops import run_state, upgrade_rollout
from cluster.ops.ray_session import attached
from cluster.ops.rest import ServeRest
from cluster.ops.rollout import RolloutTimeouts
from cluster.ops.upgrade_plan import ModelIdentity, UpgradePlan, plan_upgrade
from cluster.ops.upgrade_rollout import ingress_user_config
from cluster.serve.config_file import load_cluster_config
from cluster.serve.in_place import in_place_user_config, with_in_place
from cluster.serve.pool_options import INGRESS_DEPLOYMENT, pool_deployment_name
from cluster.serve.rollout_pools import FOLLOW_KEY, split_user_config
from core.config import ClusterConfig
from core.errors import UnavailableError, UpgradeRefusedError
from engine.builtin import resolve_model
from engine.models.config import ModelArchConfig

logger = logging.getLogger(__name__)

UPGRADE_TIMEOUT_S = 1800.0


def model_identity(name: str) -> ModelIdentity:
    """The architecture and vocabulary of the checkpoint ``name`` (a built-in or a local dir)."""
    arch = ModelArchConfig.from_dir(resolve_model(name))
    return ModelIdentity(arch.architecture, arch.vocab_size)


def running_config(
    app: dict[str, Any] | None,
    app_name: str,
    pools: dict[str, Any] | None = None,
    pools_app: str | None = None,
) -> ClusterConfig:
    """The config the deployed app ``app`` (Serve's app details) runs: its ``args`` — or, when
    a stepped rollout left the pools serving from an app of their own (``pools_app``, details
    ``pools``), that app's — with the fields an earlier upgrade applied in place (the Ingress
    deployment's ``user_config``)."""
    if app is None:
        raise UnavailableError(f"app {app_name!r} is not deployed (start it with pdserve up)")
    source, source_name = app, app_name
    if pools_app is not None and pools_app != app_name:
        if pools is None:
            raise UnavailableError(
                f"app {pools_app!r}, whose pools serve {app_name!r} since its last rollout, "
                "is not deployed"
            )
        source, source_name = pools, pools_app
    try:
        mapping = source["deployed_app_config"]["args"]["config"]
    except (KeyError, TypeError) as e:
        raise UpgradeRefusedError(
            f"app {source_name!r} was not deployed by pdserve (no config in its args)",
            param="app",
        ) from e
    fields, _ = split_user_config(ingress_user_config(app), app_name)
    return with_in_place(load_cluster_config(mapping), fields)


def upgrade(
    new: ClusterConfig,
    *,
    dry_run: bool = False,
    stepped: bool = False,
    timeouts: RolloutTimeouts | None = None,
) -> UpgradePlan:
    """Plan the upgrade of the running app to ``new`` and, unless ``dry_run``, apply it;
    returns the plan. With ``stepped``, a plan that replaces a model's pools runs as a stepped
    rollout (:func:`cluster.ops.upgrade_rollout.start`) instead of a redeploy. Raises
    :class:`UpgradeRefusedError` for what cannot be applied."""
    app_name = new.cluster.app_name
    url, address, auth_mode = run_state.target(app_name, None, "auto")
    with attached(address, auth_mode=auth_mode):
        rest = ServeRest(url)
        app = rest.app_details(app_name)
        pools_app = upgrade_rollout.serving_pools_app(app_name)
        pools = rest.app_details(pools_app) if pools_app != app_name else None
        current = running_config(app, app_name, pools, pools_app)
        plan = plan_upgrade(current, new, model_identity)
        if dry_run or plan.empty:
            return plan
        upgrade_rollout.refuse_while_recorded(
            app_name,
            redeploys=plan.restarts and not stepped,
            resizes=not plan.restarts and bool(_resized(plan, new)),
        )
        if plan.restarts and stepped:
            upgrade_rollout.start(rest, current, new, plan, timeouts or RolloutTimeouts())
            return plan
        if plan.restarts:
            logger.info("upgrading %s: replacing the pools of %s", app_name, _restarting(plan))
            rest.deploy(new)
            rest.wait_running(app_name, UPGRADE_TIMEOUT_S)
            return plan
        if plan.redeploy_fields:
            raise UpgradeRefusedError(
                f"{', '.join(plan.redeploy_fields)} changed: these apply only by redeploying "
                "the app, which restarts every replica (replicas read them, or they change the "
                "app's shape), and this upgrade replaces no pool; nothing was changed (change "
                "them with an upgrade that replaces the pools, or pdserve down then up)",
                param=plan.redeploy_fields[0].split(".")[0],
            )
        if plan.ingress_fields:
            logger.info("upgrading %s in place: %s", app_name, ", ".join(plan.ingress_fields))
            _, followed = split_user_config(ingress_user_config(app or {}), app_name)
            user_config = in_place_user_config(new)
            if followed:  # a stepped rollout's second app stays followed
                user_config[FOLLOW_KEY] = followed
            rest.reconfigure(app_name, INGRESS_DEPLOYMENT, user_config)
        resized = _resized(plan, new)
        if resized:
            rest.scale(app_name, resized)
    return plan


def _restarting(plan: UpgradePlan) -> str:
    return ", ".join(
        f"{m.name} ({', '.join(m.restart_reasons)})" for m in plan.models if m.restarts
    )


def _resized(plan: UpgradePlan, new: ClusterConfig) -> dict[str, int]:
    scopes = {m.name: m.scope for m in new.served_models()}
    replicas: dict[str, int] = {}
    for model in plan.models:
        for role, count in (("prefill", model.num_prefill), ("decode", model.num_decode)):
            if count is not None:
                replicas[pool_deployment_name(role, scopes[model.name])] = count
    return replicas
