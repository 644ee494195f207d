"""Two ``pdserve upgrade --stepped`` runs in a row on a live local cluster (``make chaos``): the
second starts from the pools app the first left serving, goes up as a third app while a light
load runs, no request fails, and once it is done only the newest pools app remains beside the
running app, and ``pdserve status`` shows the second rollout done."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cluster.serve.config_file import load_cluster_config
from tests.integration.support import pdserve_cli, repo_config_on_free_ports
from tests.waiting import wait_until

# NOTE: 4-8 minutes on a loaded 2-core machine (its own up, four replicas started one step at a
# time, down), over the integration suite's budget: make chaos runs it, make test deselects it
pytestmark = [pytest.mark.ray, pytest.mark.chaos_full, pytest.mark.timeout(900)]

PROMPT = {"model": "tiny", "prompt": "one two three four five six", "max_tokens": 4}


class LightLoad:
    """One client sending completions back to back until stopped; keeps what failed."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint, self.num_ok = endpoint, 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send_until_stopped, daemon=True)

    def __enter__(self) -> LightLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _send_until_stopped(self) -> None:
        while not self._stop.is_set():
            try:
                reply = httpx.post(f"{self.endpoint}/v1/completions", json=PROMPT, timeout=60)
            except httpx.HTTPError as e:
                self.failures.append(repr(e))
                continue
            if reply.status_code == 200:
                self.num_ok += 1
            else:
                self.failures.append(f"{reply.status_code} {reply.text[:200]}")


APPS_SCRIPT = """
import json, sys
from cluster.ops.rest import ServeRest
print(json.dumps(sorted(ServeRest(sys.argv[1]).details().get("applications", {}))))
"""


def deployed_apps(state: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The Serve apps on the cluster, read over its REST API from another process (one that
    takes the cluster's auth mode before it imports Ray, as the CLI does)."""
    auth = {"RAY_AUTH_MODE": state["ray_auth_mode"]} if state.get("ray_auth_mode") else {}
    run = subprocess.run(
        [sys.executable, "-c", APPS_SCRIPT, state["dashboard_url"]],
        env={**env, **auth},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    apps: list[str] = json.loads(run.stdout.strip().splitlines()[-1])
    return apps


def with_max_num_seqs(config: dict[str, Any], num_seqs: int, path: Path) -> Path:
    """``config`` with new engine options (the pools are replaced), written to ``path``."""
    config["engine"]["max_num_seqs"] = num_seqs
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_second_stepped_upgrade_starts_from_the_first_ones_pools(tmp_path: Path) -> None:
    def tiny(config: dict[str, Any]) -> None:
        config["model"] = {"name": "builtin:tiny-moe", "served_name": "tiny"}

    path, env = repo_config_on_free_ports("local.yaml", tmp_path, tiny)
    config = yaml.safe_load(path.read_text())
    app = load_cluster_config(path).cluster.app_name
    up = pdserve_cli("up", str(path), "--detach", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        run_state = Path(env["PDSERVE_CACHE_DIR"]) / "run" / f"{app}.json"
        state = json.loads(run_state.read_text())
        first = with_max_num_seqs(config, 6, tmp_path / "first.yaml")
        run = pdserve_cli("upgrade", "--stepped", str(first), env=env, timeout_s=420)
        assert run.returncode == 0, run.stdout + run.stderr
        second = with_max_num_seqs(config, 4, tmp_path / "second.yaml")
        with LightLoad(state["endpoint"]) as load:
            run = pdserve_cli("upgrade", "--stepped", str(second), env=env, timeout_s=420)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"(done), {app}-rollout -> {app}-rollout-2" in run.stdout, run.stdout
        assert not load.failures, load.failures[:5]
        assert load.num_ok > 0

        apps: list[str] = []

        def only_the_newest_pools_app() -> bool:
            apps[:] = deployed_apps(state, env)
            return apps == sorted([app, f"{app}-rollout-2"])

        try:
            wait_until(only_the_newest_pools_app, 60, "the superseded pools app to be deleted")
        except AssertionError as e:
            raise AssertionError(f"{e}: {apps}") from e
        status = pdserve_cli("status", "--no-stats", env=env)
        assert f"(done), {app}-rollout -> {app}-rollout-2" in status.stdout, status.stdout
        again = httpx.post(f"{state['endpoint']}/v1/completions", json=PROMPT, timeout=60)
        assert again.status_code == 200, again.text
        replan = pdserve_cli("upgrade", "--dry-run", str(second), env=env)
        assert "nothing to upgrade: the app runs this config" in replan.stdout, replan.stdout
    finally:
        pdserve_cli("down", env=env)
