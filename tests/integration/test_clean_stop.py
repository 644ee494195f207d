"""A clean stop: ``pdserve up`` started by a parent that never reaps it (a Python supervisor, a
test fixture, a CI script) and stopped by ``pdserve down``.

The app is the local default with its prefill pool autoscaled to zero, so ``/ready`` must
answer 200 while decode serves every request locally. ``down`` must return 0 within 15 s,
leave no process of the cluster (every descendant of that ``up``) running, and nothing may
print Ray's signal-handler stack trace on the terminal (``up``'s and ``down``'s output).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cluster.ops import process_tree
from cluster.ops.process_tree import ProcessRef
from tests.integration.support import repo_config_on_free_ports
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

DOWN_BUDGET_S = 15.0
SIGNAL_TRACE_MARKERS = ("SIGTERM received", "PC: @", "logging.cc")


def scale_prefill_from_zero(config: dict[str, Any]) -> None:
    """Prefill autoscaling from zero, on a small local Ray."""
    del config["prefill"]["num_replicas"]
    config["prefill"]["autoscaling"] = {"min_replicas": 0, "max_replicas": 1}
    config["cluster"]["num_cpus"] = 4


def scaled_to_zero_config(tmp_path: Path) -> Path:
    """configs/local.yaml on free ports with :func:`scale_prefill_from_zero` applied."""
    path, _ = repo_config_on_free_ports("local.yaml", tmp_path, scale_prefill_from_zero)
    return path


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (None once the pid is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def recorded_state(state_file: Path, owner_pid: int) -> dict[str, Any] | None:
    """The run state ``up`` writes once it is ready, when it is this ``up``'s."""
    if not state_file.exists():
        return None
    state: dict[str, Any] = json.loads(state_file.read_text())
    return state if state.get("owner_pid") == owner_pid else None


def local_prefill_count(endpoint: str) -> float:
    """``pdserve:disagg_decisions_total`` for local prefill with no prefill capacity."""
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pdserve:disagg_decisions_total{")
        and 'reason="no_prefill_capacity"' in line
    )


def test_down_stops_an_unreaped_up_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "PDSERVE_CACHE_DIR": str(tmp_path / "cache")}
    state_file = tmp_path / "cache" / "run" / "pdserve.json"
    terminal = tmp_path / "up-terminal.txt"
    config_path = scaled_to_zero_config(tmp_path)
    command = [sys.executable, "-m", "cluster.ops.cli", "up", str(config_path)]
    with terminal.open("wb") as out:
        up = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    cluster: list[ProcessRef] = []
    try:
        state = wait_until(
            lambda: (
                {"exited": True}
                if proc_state(up.pid) in (None, "Z")
                else recorded_state(state_file, up.pid)
            ),
            420,
            "pdserve up ready",
            poll_s=0.2,
        )
        assert "exited" not in state, terminal.read_text(errors="replace")[-3000:]
        endpoint = state["endpoint"]
        ready = httpx.get(f"{endpoint}/ready", timeout=30)
        assert ready.status_code == 200, ready.text
        alone = "decode serves alone: no prefill replica is running (colocated or scaled to 0)"
        assert ready.json() == {
            "status": "ready", "draining": False, "prefill": False, "decode": True,
            "degraded": [],  # a pool that may scale to zero is not missing
            "reason": alone,
        }  # fmt: skip
        prompt = "A prompt long enough to go to the prefill pool if it had a replica. " * 2
        served = yaml.safe_load(config_path.read_text())["model"]["served_name"]
        body = {"model": served, "prompt": prompt, "max_tokens": 4}
        completion = httpx.post(f"{endpoint}/v1/completions", json=body, timeout=120)
        assert completion.status_code == 200, completion.text
        assert local_prefill_count(endpoint) >= 1

        cluster = process_tree.descendants(up.pid)
        assert len(cluster) >= 5  # gcs, raylet, dashboard, Serve's actors, the replicas
        started = time.monotonic()
        down = subprocess.run(
            [sys.executable, "-m", "cluster.ops.cli", "down"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        elapsed_s = time.monotonic() - started

        assert down.returncode == 0, down.stdout + down.stderr
        assert elapsed_s < DOWN_BUDGET_S, f"down took {elapsed_s:.1f}s"
        assert proc_state(up.pid) == "Z"  # up exited and is still unreaped: the case at hand
        left = [process.pid for process in cluster if process_tree.still_running(process)]
        assert not left, f"processes of the cluster still running: {left}"
        assert not state_file.exists()
        output = terminal.read_text(errors="replace") + down.stdout + down.stderr
        traces = [
            line for line in output.splitlines() if any(m in line for m in SIGNAL_TRACE_MARKERS)
        ]
        assert not traces, "\n".join(traces)
    finally:
        if up.poll() is None:  # a failure above: stop it, and whatever it left
            up.terminate()
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        process_tree.kill(cluster)
    assert up.returncode == 0, terminal.read_text(errors="replace")[-3000:]
