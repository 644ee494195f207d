"""``pdserve upgrade --stepped`` on a live local cluster under streaming greedy load
(``make chaos``): the new version's pools go up as a second app, the ingress follows them and
every step runs. Across a model revision (other weights) no request fails and every output is
one version's own greedy output, the P:D ratio holds on Serve at every step, every KV block is
released and no ``/dev/shm`` segment stays behind; across an engine-option change (same
weights, same fingerprint) with a short drain under long streams, the leaving decode replica
hands its streams off (each continues on the new version from its pulled blocks), every
output is the no-upgrade greedy output, and no deployment of the running app restarts (its
ingress and stats board keep serving while its pools go to 0).

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


def problems(result: Result) -> list[str]:
    """What broke the rules: a failed request, a mixed output, the ratio off by more than one
    replica, KV or shared memory left behind."""
    found = []
    if result.upgrade.returncode != 0:
        found.append(f"upgrade failed: {result.upgrade.stdout}{result.upgrade.stderr}")
    if result.failures:
        found.append(f"{len(result.failures)} requests failed: {result.failures[:2]}")
    if result.mixed:
        found.append(f"{len(result.mixed)} outputs of no version: {result.mixed[:2]}")
    if not any(o.phase == "during" for o in result.outcomes):
        found.append("no request ran during the upgrade")
    if not result.watch.num_polls or result.watch.max_deviation > 1.0:
        found.append(f"P:D bound: {result.watch.num_polls} polls, worst {result.watch.worst}")
    if result.kv_blocks_used_after != 0:
        found.append(f"{result.kv_blocks_used_after} KV blocks still in use")
    if result.shm_left_after_upgrade or result.shm_left_after_down:
        found.append(f"/dev/shm left: {result.shm_left_after_upgrade | result.shm_left_after_down}")
    return found


def test_an_upgrade_to_other_weights_mixes_no_versions_and_keeps_the_ratio(
    tmp_path: Path,
) -> None:
    scenario = Scenario(other_weights=True, num_prefill=1, num_decode=2, max_tokens=8)
    result = run_upgrade(scenario, tmp_path)
    assert not problems(result), (problems(result), result.summary())
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


@pytest.mark.timeout(900)
def test_long_streams_across_a_same_fingerprint_upgrade_are_token_identical(
    tmp_path: Path,
) -> None:
    # same weights, another max_num_seqs: the pools are replaced, the fingerprint kept; the
    # cordoned decode pool gets a one-second drain, which long streams outlast: it hands them
    # off and each continues on the new version's decode replica from its pulled blocks
    scenario = Scenario(
        other_weights=False,
        num_prefill=1,
        num_decode=1,
        clients=6,
        max_tokens=384,
        warmup_requests=4,
        drain_timeout_s=1.0,
        graceful_shutdown_timeout_s=0.5,
    )
    result = run_upgrade(scenario, tmp_path, inspect=running_app_idle_then_serving)
    assert all(len(texts) == 1 for texts in result.references)  # one version's outputs
    found = problems(result)
    if result.watch.restarted():
        # the streams on a restarted ingress break once its graceful shutdown is over
        found.append(f"the rollout restarted the running app's {result.watch.restarted()}")
    if not result.handoffs or not result.handoff_blocks_pulled:
        found.append("no stream was handed off by the leaving decode replica with its blocks")
    assert not found, (found, result.summary())
    assert "step 2/2: Prefill 0 old + 1 new, Decode 0 old + 1 new (done)" in result.upgrade.stdout
