"""Stand-ins shared by the ``pdserve upgrade`` tests: a Serve REST API that records its calls,
a fleet whose replicas come and go at once, and the patches that point the upgrade code at
them (no dashboard, no Ray, the run state in a temporary cache directory)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cluster.ops.rollout import PoolHealth, Version
from cluster.ops.upgrade_plan import ModelIdentity
from core.config import ClusterConfig, Role


@dataclass
class FakeRest:
    """The Serve REST calls the upgrade makes, recorded; ``app`` is what the app reports, and
    ``apps`` what other apps (a rollout's pools apps) report, by name."""

    app: dict[str, Any] | None
    calls: list[tuple[str, Any]] = field(default_factory=list)
    apps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def app_details(self, app_name: str) -> dict[str, Any] | None:
        return self.apps.get(app_name, self.app)

    def deploy(self, config: ClusterConfig) -> None:
        self.calls.append(("deploy", config))

    def deploy_app(self, entry: Mapping[str, Any]) -> None:
        self.calls.append(("deploy_app", dict(entry)))

    def wait_running(self, app_name: str, timeout_s: float) -> dict[str, Any]:
        self.calls.append(("wait_running", app_name))
        return {}

    def scale(self, app_name: str, replicas: dict[str, int]) -> None:
        self.calls.append(("scale", replicas))

    def reconfigure(self, app_name: str, deployment: str, user_config: dict[str, Any]) -> None:
        self.calls.append(("reconfigure", (deployment, user_config)))
        if self.app is not None:  # what Serve then reports, as a later read sees it
            deployments = self.app.setdefault("deployed_app_config", {}).setdefault(
                "deployments", []
            )
            deployments[:] = [d for d in deployments if d.get("name") != deployment]
            deployments.append({"name": deployment, "user_config": dict(user_config)})

    def remove(self, app_name: str) -> None:
        self.calls.append(("remove", app_name))
        self.apps.pop(app_name, None)


class InstantFleet:
    """Every replica asked for is up and every one dropped is gone at the first look."""

    def __init__(self, apps: dict[Version, str] | None = None, scope: str = "") -> None:
        self.apps, self.scope = apps or {}, scope
        self.sizes: dict[tuple[Version, Role], int] = {}

    def set_replicas(self, version: Version, role: Role, num_replicas: int) -> None:
        self.sizes[(version, role)] = num_replicas

    def health(self, version: Version, role: Role) -> PoolHealth:
        size = self.sizes.get((version, role), 0)
        return PoolHealth(size, size, 0, 0)

    def cordon(self, version: Version, role: Role, cordoned: bool) -> None:
        pass  # nothing in flight here: the driver's quiet wait ends at once

    def hand_off(self, version: Version, role: Role) -> None:
        raise AssertionError("nothing is in flight: the driver never asks for a handoff")


def offline_upgrade(
    module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rest: FakeRest | None
) -> None:
    """Point ``module`` (``cluster.ops.upgrade`` or ``upgrade_rollout``) at ``rest`` and a
    dashboard that needs no cluster; the run state (no rollout recorded) under ``tmp_path``."""
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))

    @contextlib.contextmanager
    def attached(address: str, auth_mode: str | None = None) -> Iterator[None]:
        yield

    monkeypatch.setattr(module, "ServeRest", lambda url: rest)
    monkeypatch.setattr(module, "attached", attached)
    monkeypatch.setattr(module.run_state, "target", lambda *args: ("http://dash", "auto", None))
    if hasattr(module, "model_identity"):
        monkeypatch.setattr(
            module, "model_identity", lambda name: ModelIdentity("LlamaForCausalLM", 256)
        )
