"""The judging pieces of ``benchmarks/serve_upgrade.py`` on made-up Serve details and outcomes:
the P:D deviation of each app's pools, the replicas seen, segments by pid, mixed outputs."""

from __future__ import annotations

import subprocess
from typing import Any

from benchmarks.serve_upgrade import Outcome, PoolWatch, Result, segments_of


def pool(target: int, states: list[str], first_pid: int) -> dict[str, Any]:
    replicas = [
        {"replica_id": f"r{first_pid + i}", "state": state, "pid": first_pid + i}
        for i, state in enumerate(states)
    ]
    return {"target_num_replicas": target, "replicas": replicas}


def details(old: tuple[int, int], new: tuple[int, int] | None, ingress: str) -> dict[str, Any]:
    apps: dict[str, Any] = {
        "app": {
            "deployments": {
                "Prefill": pool(old[0], ["RUNNING"] * old[0], 100),
                "Decode": pool(old[1], ["RUNNING"] * old[1], 110),
                "Ingress": {"replicas": [{"replica_id": ingress, "state": "RUNNING", "pid": 7}]},
            }
        }
    }
    if new is not None:
        apps["app-rollout"] = {
            "deployments": {
                "Prefill": pool(new[0], ["RUNNING"] * new[0], 200),
                "Decode": pool(new[1], ["STARTING"] + ["RUNNING"] * (new[1] - 1), 210),
            }
        }
    return {"applications": apps}


def test_the_watch_keeps_the_worst_deviation_of_either_app_and_every_pid() -> None:
    watch = PoolWatch(details=dict, app_name="app", num_prefill=1, num_decode=2)
    watch.observe(details((1, 2), None, "i1"))
    assert watch.max_deviation == 0
    watch.observe(details((0, 2), (1, 0), "i1"))  # a rolling step: one replica off each
    assert watch.max_deviation == 1.0
    watch.observe(details((0, 0), (1, 2), "i1"))  # targets 1:2, running 1:1 (one starting)
    assert watch.max_deviation == 1.0
    assert {100, 110, 111, 200, 210, 211, 7} <= watch.pids
    assert watch.restarted() == []
    watch.observe(details((0, 0), (1, 2), "i2"))
    assert watch.restarted() == ["Ingress"]


def test_a_far_off_ratio_is_recorded_with_its_app() -> None:
    watch = PoolWatch(details=dict, app_name="app", num_prefill=1, num_decode=2)
    watch.observe(details((1, 0), None, "i1"))  # 1 prefill, no decode: |1*2 - 0| / 2
    assert watch.max_deviation == 1.0
    watch.observe(details((1, 2), (2, 0), "i1"))  # |2*2 - 0| / 2
    assert watch.max_deviation == 2.0 and watch.worst.startswith("app-rollout")


def test_segments_are_told_apart_by_the_creating_pid() -> None:
    names = {"pdserve-kv-ns-100-aa", "pdserve-kv-ns-1000-bb", "pdserve-kv-ns-7-cc"}
    assert segments_of(names, {100, 7}) == {"pdserve-kv-ns-100-aa", "pdserve-kv-ns-7-cc"}
    assert segments_of(names, set()) == set()


def test_an_output_of_neither_version_is_mixed_and_failures_are_not() -> None:
    outcomes = [
        Outcome("before", 0, 0.1, "old text", None),
        Outcome("during", 0, 0.1, "new text", None),
        Outcome("during", 0, 0.1, "old prefix then new", None),
        Outcome("during", 1, 0.0, "", "RemoteProtocolError"),
    ]
    references = [{"old": "old text", "new": "new text"}, {"old": "x", "new": "y"}]
    result = Result(
        outcomes, references, subprocess.CompletedProcess([], 0), 1.0,
        PoolWatch(details=dict, app_name="app", num_prefill=1, num_decode=1), 0.0, 0.0, 0.0, 0.0,
        set(), set(),
    )  # fmt: skip
    assert [o.text for o in result.mixed] == ["old prefix then new"]
    assert len(result.failures) == 1
    assert result.versions_answering() == {"old", "new"}
    summary = result.summary()
    assert summary["requests_failed"] == 1 and summary["mixed_version_outputs"] == 1
