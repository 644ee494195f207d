"""Serve's REST API on the Ray dashboard: deploy, inspect, scale and delete the pdserve app.

A thin wrapper over Ray's own Serve SDK client (the one ``serve deploy`` / ``serve status``
use; it adds the cluster's auth token), with errors turned into ``core.errors`` types and a
``wait_running`` that polls the app's status until it is RUNNING or fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from cluster.ops.deploy_schema import configured_schema, deploy_schema, scaled_schema, with_app
from core.config import ClusterConfig
from core.errors import ConfigError, UnavailableError

logger = logging.getLogger(__name__)

_FAILED = {"DEPLOY_FAILED", "UNHEALTHY"}


class ServeRest:
    """The Serve REST API of one Ray cluster, at its dashboard URL."""

    def __init__(self, dashboard_url: str) -> None:
        from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

        self.dashboard_url = dashboard_url
        try:
            self._client = ServeSubmissionClient(dashboard_url)
        except (OSError, RuntimeError, ValueError) as e:
            raise UnavailableError(f"no Ray dashboard at {dashboard_url}: {e}") from e

    def details(self) -> dict[str, Any]:
        """Serve's instance details (apps, deployments, replicas with their nodes)."""
        return self._call(self._client.get_serve_details)

    def app_details(self, app_name: str) -> dict[str, Any] | None:
        """One application's details, or None when it is not deployed."""
        app: dict[str, Any] | None = self.details().get("applications", {}).get(app_name)
        return app

    def deploy(self, config: ClusterConfig) -> None:
        """Deploy (or update) the pdserve app, keeping other declaratively deployed apps."""
        self._call(
            self._client.deploy_applications, deploy_schema(config, self._other_apps(config))
        )

    def scale(self, app_name: str, replicas: Mapping[str, int]) -> None:
        """Set fixed replica counts of deployments of ``app_name``, in place."""
        deployed = (self.app_details(app_name) or {}).get("deployments", {})
        missing = sorted(set(replicas) - set(deployed))
        if missing:
            raise ConfigError(
                f"app {app_name} has no {', '.join(missing)} deployment (a pool configured with "
                "0 replicas is left out); redeploy it with at least one replica",
                param=missing[0],
            )
        current = self._current_schema()
        self._call(self._client.deploy_applications, scaled_schema(current, app_name, replicas))

    def deploy_app(self, entry: Mapping[str, Any]) -> None:
        """Deploy (or update) one application ``entry``, keeping every other app as it is."""
        self._call(self._client.deploy_applications, with_app(self._current_schema(), entry))

    def reconfigure(self, app_name: str, deployment: str, user_config: Mapping[str, Any]) -> None:
        """Set ``deployment``'s ``user_config``: its running replicas are reconfigured, none
        restarts."""
        current = self._current_schema()
        schema = configured_schema(current, app_name, deployment, user_config)
        self._call(self._client.deploy_applications, schema)

    def remove(self, app_name: str) -> None:
        """Delete ``app_name``, keeping the other declaratively deployed apps."""
        current = self._current_schema()
        apps = current["applications"]
        kept = [app for app in apps if app.get("name") != app_name]
        if not kept:
            self._call(self._client.delete_applications)
        elif len(kept) < len(apps):
            self._call(self._client.deploy_applications, {**current, "applications": kept})

    def wait_running(self, app_name: str, timeout_s: float, poll_s: float = 1.0) -> dict[str, Any]:
        """Poll until ``app_name`` is RUNNING; UnavailableError on failure or timeout."""
        deadline = time.monotonic() + timeout_s
        status, message = "NOT_STARTED", ""
        while time.monotonic() < deadline:
            app = self.app_details(app_name)
            if app is not None:
                status, message = str(app.get("status")), str(app.get("message", ""))
                if status == "RUNNING":
                    return app
                if status in _FAILED:
                    raise UnavailableError(f"app {app_name} is {status}: {message}")
            time.sleep(poll_s)
        raise UnavailableError(
            f"app {app_name} not running after {timeout_s:.0f}s (status {status}: {message})"
        )

    def _current_schema(self) -> dict[str, Any]:
        details = self.details()
        apps = [
            app["deployed_app_config"]
            for app in details.get("applications", {}).values()
            if app.get("deployed_app_config")
        ]
        schema: dict[str, Any] = {"applications": apps}
        for key in ("proxy_location", "http_options"):
            if details.get(key) is not None:
                schema[key] = details[key]
        return schema

    def _other_apps(self, config: ClusterConfig) -> dict[str, dict[str, Any]]:
        apps = self.details().get("applications", {})
        return {
            name: app["deployed_app_config"]
            for name, app in apps.items()
            if name != config.cluster.app_name and app.get("deployed_app_config")
        }

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except RuntimeError as e:
            raise ConfigError(f"Serve REST call failed: {e}", param="serve") from e
        except OSError as e:  # requests' connection errors are OSErrors
            raise UnavailableError(f"Ray dashboard {self.dashboard_url} unreachable: {e}") from e
