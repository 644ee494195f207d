"""``pdserve upgrade --stepped`` on a live local cluster under load (``make chaos``): the new
version's pools go up as a second app, the ingress follows them, every step runs, no request
fails, and the second app ends serving every replica while the running app's pools are idle
at 0."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.support import pdserve_cli, repo_config_on_free_ports
from tests.waiting import wait_until

# NOTE: 2-4 minutes on a loaded 2-core machine (its own up, two replicas started, down),
# over the integration suite's budget: make chaos runs it, make test deselects it
pytestmark = [pytest.mark.ray, pytest.mark.chaos_full, pytest.mark.timeout(300)]


def tiny(config: dict[str, Any]) -> None:
    config["model"] = {"name": "builtin:tiny-moe", "served_name": "tiny"}


class Load:
    """Completions sent one after another until stopped; counts the ones that failed."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint, self.num_ok = endpoint, 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        body = {"model": "tiny", "prompt": "one two three four five six", "max_tokens": 4}
        while not self._stop.is_set():
            try:
                reply = httpx.post(f"{self.endpoint}/v1/completions", json=body, timeout=60)
            except httpx.HTTPError as e:
                self.failures.append(repr(e))
                continue
            if reply.status_code == 200:
                self.num_ok += 1
            else:
                self.failures.append(f"{reply.status_code} {reply.text[:200]}")


def test_a_stepped_upgrade_replaces_the_pools_under_load(tmp_path: Path) -> None:
    path, env = repo_config_on_free_ports("local.yaml", tmp_path, tiny)
    up = pdserve_cli("up", str(path), "--detach", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((Path(env["PDSERVE_CACHE_DIR"]) / "run" / "pdserve.json").read_text())
        config = yaml.safe_load(path.read_text())
        config["engine"]["max_num_seqs"] = 8  # new engine options: the pools are replaced
        new = tmp_path / "new.yaml"
        new.write_text(yaml.safe_dump(config))
        with Load(state["endpoint"]) as load:
            run = pdserve_cli("upgrade", "--stepped", str(new), env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "step 2/2: Prefill 0 old + 1 new, Decode 0 old + 1 new (done)" in run.stdout
        assert not load.failures, load.failures[:5]
        assert load.num_ok > 0
        status = pdserve_cli("status", "--no-stats", env=env)
        assert "rollout of" in status.stdout and "(done)" in status.stdout, status.stdout

        seen: list[Any] = []

        def running_app_idle() -> bool:
            shown = json.loads(pdserve_cli("status", "--no-stats", "--json", env=env).stdout)
            pools = [p for p in shown["pools"] if p["pool"] in ("Prefill", "Decode")]
            seen[:] = [(p["pool"], p["target_replicas"], p["replicas"]) for p in pools]
            return len(seen) == 2 and all(t == 0 and not r for _, t, r in seen)

        try:
            wait_until(running_app_idle, 60, "the running app's pools to be down to 0")
        except AssertionError as e:
            raise AssertionError(f"{e}: {seen}") from e
        again = httpx.post(
            f"{state['endpoint']}/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
            timeout=60,
        )
        assert again.status_code == 200, again.text
    finally:
        pdserve_cli("down", env=env)
