"""``pdserve upgrade --stepped`` on a live local cluster under streaming greedy load
(``make chaos``): the new version's pools go up as a second app, the ingress follows them and
every step runs. Across a model revision (other weights) no request fails and every output is
one version's own greedy output, the P:D ratio holds on Serve at every step, every KV block is
released and no ``/dev/shm`` segment stays behind; across an engine-option change (same
weights, same fingerprint) with a short drain, the streams still on a leaving decode replica
migrate and every output is the no-upgrade greedy output.

The cluster, load, Serve watcher and checks are ``benchmarks/serve_upgrade.py`` (the
benchmark's ``--serve`` mode runs the same upgrade)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.serve_upgrade import SERVED, Result, Scenario, pdserve, run_upgrade
from tests.waiting import wait_until

# NOTE: 3-5 minutes each on a loaded 2-core machine (its own up, a replica started per step,
# down), over the integration suite's budget: make chaos runs them, make test deselects them
pytestmark = [pytest.mark.ray, pytest.mark.chaos_full, pytest.mark.timeout(600)]


def assert_clean(result: Result) -> None:
    """No failed request, no mixed output, the ratio held, KV and shared memory released."""
    assert result.upgrade.returncode == 0, result.upgrade.stdout + result.upgrade.stderr
    assert not result.failures, result.failures[:3]
    assert not result.mixed, result.mixed[:3]
    during = [o for o in result.outcomes if o.phase == "during"]
    assert during, "no request ran during the upgrade"
    assert result.watch.num_polls > 0
    assert result.watch.max_deviation <= 1.0, result.watch.worst
    assert result.kv_blocks_used_after == 0
    assert not result.shm_left_after_upgrade, result.shm_left_after_upgrade
    assert not result.shm_left_after_down, result.shm_left_after_down


def test_an_upgrade_to_other_weights_mixes_no_versions_and_keeps_the_ratio(
    tmp_path: Path,
) -> None:
    scenario = Scenario(other_weights=True, num_prefill=1, num_decode=2, max_tokens=8)
    result = run_upgrade(scenario, tmp_path)
    assert_clean(result)
    assert "step 3/3: Prefill 0 old + 1 new, Decode 0 old + 2 new (done)" in result.upgrade.stdout
    # the upgrade was seen: each version answered some prompt its own way
    assert len(result.versions_answering()) == 2, result.summary()


def running_app_idle_then_serving(state: Mapping[str, Any], env: Mapping[str, str]) -> None:
    """``pdserve status`` shows the rollout done, the running app's pools end at 0, and the
    endpoint still answers (the rollout app serves)."""
    status = pdserve("status", "--no-stats", env=env)
    assert "rollout of" in status.stdout and "(done)" in status.stdout, status.stdout
    seen: list[Any] = []

    def running_app_idle() -> bool:
        shown = json.loads(pdserve("status", "--no-stats", "--json", env=env).stdout)
        pools = [p for p in shown["pools"] if p["pool"] in ("Prefill", "Decode")]
        seen[:] = [(p["pool"], p["target_replicas"], p["replicas"]) for p in pools]
        return len(seen) == 2 and all(t == 0 and not r for _, t, r in seen)

    try:
        wait_until(running_app_idle, 60, "the running app's pools to be down to 0")
    except AssertionError as e:
        raise AssertionError(f"{e}: {seen}") from e
    again = httpx.post(
        f"{state['endpoint']}/v1/completions",
        json={"model": SERVED, "prompt": "hello", "max_tokens": 4},
        timeout=60,
    )
    assert again.status_code == 200, again.text


def test_streams_on_a_leaving_decode_migrate_token_identical(tmp_path: Path) -> None:
    # same weights, another max_num_seqs: the pools are replaced, the fingerprint kept; a
    # stopping decode replica gets half a second before Serve ends it, so long streams on it
    # break and must continue elsewhere
    scenario = Scenario(
        other_weights=False,
        num_prefill=1,
        num_decode=1,
        clients=4,
        max_tokens=128,
        warmup_requests=4,
        drain_timeout_s=1.0,
        graceful_shutdown_timeout_s=0.5,
    )
    result = run_upgrade(scenario, tmp_path, inspect=running_app_idle_then_serving)
    assert_clean(result)
    assert "step 2/2: Prefill 0 old + 1 new, Decode 0 old + 1 new (done)" in result.upgrade.stdout
    assert all(len(texts) == 1 for texts in result.references)  # one version's outputs
    assert result.migrations > 0, result.summary()
