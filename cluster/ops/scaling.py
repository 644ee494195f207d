"""``pdserve scale``: one model's pools resized in place through Serve's REST API.

A one-model app's pools are the deployments ``Prefill`` and ``Decode``; with several models each
has its own (``Decode-<model>``), and ``--model`` says which to resize (the others' replicas are
not touched). The counts become fixed ones (an autoscaling pool is pinned to them).

After a finished stepped rollout a model's pools serve from another app (``cluster.ops.
live_pools``): those are resized, not the superseded ones held at 0; while a rollout of the
model is under way its driver owns the sizes and a scale is refused.

A pool set to 0 (``--prefill 0``) is cordoned on the app's stats board first — the ingress pairs
no new request with it — and set to 0 once nothing has been in flight on it for ``QUIET_S``
(at most ``ZERO_DRAIN_TIMEOUT_S``), as a stepped rollout does: Serve starts a replica for a
pool at 0 while it still counts requests there (its cold start), and a request paired with it
would wait for that start. A pool scaled up again is uncordoned first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cluster.ops import run_state
from cluster.ops.board_calls import board_cordon, board_snapshot
from cluster.ops.live_pools import model_pools
from cluster.ops.ray_session import attached
from cluster.ops.rest import ServeRest
from cluster.ops.rollout import POLL_S, QuietFor
from cluster.ops.rollout_fleet import pool_health
from cluster.serve.pool_options import (
    DECODE_DEPLOYMENT,
    pool_deployment_name,
    pool_of_deployment,
)
from cluster.serve.pool_scaling import QUIET_S
from core.errors import ConfigError, UnavailableError

logger = logging.getLogger(__name__)

ZERO_DRAIN_TIMEOUT_S = 30.0
"""How long a pool going to 0 may take to go quiet before it is set to 0 anyway."""


@dataclass(frozen=True)
class Scaled:
    """What a scale asked Serve for."""

    app_name: str
    """The app whose pools were resized: the one serving the model now (after a finished
    stepped rollout, the rollout's)."""
    replicas: dict[str, int]
    """Deployment -> replica count."""


def scale(
    app_name: str,
    num_prefill: int | None,
    num_decode: int | None,
    dashboard_url: str | None = None,
    ray_address: str = "auto",
    model: str | None = None,
) -> Scaled:
    """Set one model's pools' replica counts in place (``model``: its served name; needed
    when the app serves several), in the app that serves that model now; returns that app and
    the deployments and counts asked for."""
    counts = {"prefill": num_prefill, "decode": num_decode}
    if all(count is None for count in counts.values()):
        raise ConfigError("give --prefill N and/or --decode M", param="scale")
    if counts["decode"] == 0:
        raise ConfigError("decode needs at least one replica", param="decode")
    url, address, auth_mode = run_state.target(app_name, dashboard_url, ray_address)
    with attached(address, auth_mode=auth_mode):
        rest = ServeRest(url)
        deployed = (rest.app_details(app_name) or {}).get("deployments", {})
        scope = model_scope(app_name, deployed, model)
        live_app = model_pools(app_name, scope).live
        replicas = {
            pool_deployment_name(role, scope): count
            for role, count in counts.items()
            if count is not None
        }
        cordon = _typed(board_cordon(app_name), app_name)
        for deployment, count in replicas.items():
            if count:
                cordon(live_app, deployment, False)  # back from 0: paired with again
        for deployment, count in replicas.items():
            if not count:
                cordon(live_app, deployment, True)
                _wait_quiet(rest, app_name, live_app, deployment)
        rest.scale(live_app, replicas)
    return Scaled(live_app, replicas)


def _typed(
    cordon: Callable[[str, str, bool], None], app_name: str
) -> Callable[[str, str, bool], None]:
    """``cordon`` raising :class:`UnavailableError` when the app's stats board does not answer
    (a pool left cordoned would take no request: the scale stops before resizing)."""

    def call(pools_app: str, deployment: str, cordoned: bool) -> None:
        try:
            cordon(pools_app, deployment, cordoned)
        except Exception as e:
            raise UnavailableError(
                f"the stats board of app {app_name} did not answer ({type(e).__name__}: {e}); "
                "nothing was resized: try again once the app is healthy",
                param="scale",
            ) from e

    return call


def _wait_quiet(rest: ServeRest, app_name: str, live_app: str, deployment: str) -> None:
    """Until nothing has been in flight on the cordoned pool for ``QUIET_S``, at most
    ``ZERO_DRAIN_TIMEOUT_S`` (then it goes to 0 anyway: its requests fail over)."""
    quiet = QuietFor(QUIET_S)
    deadline_s = time.monotonic() + ZERO_DRAIN_TIMEOUT_S
    while not quiet(
        pool_health(rest, board_snapshot(app_name), live_app, deployment), time.monotonic()
    ):
        if time.monotonic() >= deadline_s:
            logger.warning(
                "%s of %s still had requests in flight after %g s; it goes to 0 now",
                deployment, live_app, ZERO_DRAIN_TIMEOUT_S,
            )  # fmt: skip
            return
        time.sleep(POLL_S)


def model_scope(app_name: str, deployed: Mapping[str, Any], model: str | None) -> str:
    """The deployment suffix of ``model``'s pools in the app (empty for a one-model app)."""
    models = sorted(
        {parsed[1] for name in deployed if (parsed := pool_of_deployment(name)) and parsed[1]}
    )
    if not models:
        return ""  # a one-model app (--model, if given, is that model: nothing to pick)
    if model is None:
        raise ConfigError(
            f"app {app_name} serves several models ({', '.join(models)}); pass --model NAME",
            param="model",
        )
    suffix = pool_deployment_name("decode", model).removeprefix(DECODE_DEPLOYMENT + "-")
    if suffix not in models:
        raise ConfigError(
            f"app {app_name} serves no model {model!r}; its models: {', '.join(models)}",
            param="model",
        )
    return model
