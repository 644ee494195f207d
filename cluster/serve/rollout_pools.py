"""The root of a rolling upgrade's pools app (a new version's pools, and nothing else), and
how the ingress is told to follow such apps.

Serve deploys what an app's root binds, so this tiny deployment (one replica, no CPU) holds the
handles of the new version's Prefill and Decode deployments; it serves no request. The pools'
replicas report to the running app's stats board and KV index (the app builder's
:func:`~cluster.serve.app_builder.build_pools_app_from_config`). Each stepped rollout deploys
one such app; the running app's ingress learns which apps serve a model through its
``user_config`` (:data:`FOLLOW_KEY`, beside the in-place config fields), so following them
restarts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

ROLLOUT_ROOT_DEPLOYMENT = "RolloutPools"
"""The root deployment's name in a rollout's second app."""


class RolloutPools:
    """Holds one app's pool handles: ``{served name: (prefill or None, decode)}``."""

    def __init__(self, pools: dict[str, tuple[DeploymentHandle | None, DeploymentHandle]]) -> None:
        self._pools = pools

    def models(self) -> list[str]:
        """The served models whose pools this app holds."""
        return sorted(self._pools)


FOLLOW_KEY = "pools_apps"
"""The Ingress deployment's ``user_config`` key naming, per served model, the Serve apps whose
pools serve it (``{served name: [app, ...]}``, oldest version first; the running app is named
when its own pools still serve). A model left out is served by the running app's pools alone.
The first app listed takes the requests whose version no app is known for. The older shape
``{served name: app}`` (one rollout's app beside the running app's pools) still reads."""


def split_user_config(
    user_config: Mapping[str, Any] | None, home_app: str
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The ingress's ``user_config`` as its in-place config fields and the pools apps each
    model follows (:data:`FOLLOW_KEY`); ``home_app`` is the running app, which the older
    shape leaves implicit."""
    fields = dict(user_config or {})
    return fields, followed_apps(fields.pop(FOLLOW_KEY, None), home_app)


def followed_apps(value: object, home_app: str) -> dict[str, list[str]]:
    """:data:`FOLLOW_KEY`'s value read as ``{served name: [app, ...]}``; raises
    :class:`ConfigError` for anything else."""
    if value is None:
        return {}
    followed: dict[str, list[str]] = {}
    if isinstance(value, Mapping):
        for name, apps in value.items():
            if isinstance(apps, str):  # the older shape: the running app's pools and ``apps``
                apps = [home_app, apps]
            if not isinstance(name, str) or not _app_names(apps):
                break
            followed[name] = list(dict.fromkeys(apps))
        else:
            return followed
    raise ConfigError(
        f"user_config.{FOLLOW_KEY} maps served model names to lists of app names, got {value!r}",
        param=f"user_config.{FOLLOW_KEY}",
    )


def _app_names(apps: object) -> bool:
    return (
        isinstance(apps, list | tuple)
        and bool(apps)
        and all(isinstance(app, str) and app for app in apps)
    )
