"""A load test that injects faults into the live app (``events:`` of a bench config): transfers
fail for a while (decode recomputes), the busiest decode replica is killed (its streams
migrate), the prefill pool is scaled through ``pdserve scale``. The report names each fault,
no request fails, the counters each fault should move moved, and latency recovers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cluster.ops.scaling import scale
from loadtest.bench import prepare_sessions, run_benchmark
from loadtest.flags import validate
from loadtest.tokens import WordCounter
from tests.cluster_fixtures import ServingApp, SimCluster
from tests.integration.support import APP_NAME, SERVED_NAME
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

REQUESTS = 22


def _decode_ready(app: ServingApp, count: int) -> bool:
    reporting = [r for r in app.board().get("decode", []) if r.get("actor_name")]
    return len(app.running_replicas("Decode")) == count and len(reporting) == count


def _moved(event: dict[str, Any], prefix: str) -> float:
    return sum(v for k, v in event["counters"].items() if k.startswith(prefix))


def test_a_fault_schedule_reports_its_faults(app: ServingApp, sim_cluster: SimCluster) -> None:
    scale(APP_NAME, None, 2, dashboard_url=sim_cluster.dashboard_url)
    wait_until(lambda: _decode_ready(app, 2), 180, "two decode replicas serving")
    config = validate(
        {
            "target": {"base_url": app.url(""), "model": SERVED_NAME, "ignore_eos": True,
                       "temperature": 0, "request_timeout_s": 120},
            "workload": {"kind": "random", "input_len": {"tokens": 40},
                         "output_len": {"tokens": 96}},
            # seed 0's 22nd arrival is at 9.3 s: requests still arrive after the last event
            # (at 9 s) however fast they are served, and more only lengthen the run
            "arrivals": {"num_requests": REQUESTS, "request_rate": 2.5, "max_concurrency": 4},
            "slo": {"ttft_ms": 10000, "tpot_ms": 2000},
            "events": [
                {"at_s": 1.5, "action": "transfer_fail", "duration_s": 3.0},
                {"at_s": 7.0, "action": "kill_replica", "pool": "decode"},
                {"at_s": 9.0, "action": "scale", "pool": "prefill", "replicas": 2},
            ],
            "control": {"app_name": APP_NAME, "dashboard_url": sim_cluster.dashboard_url,
                        "ray_address": sim_cluster.cluster.address, "recovery_window_s": 2.0},
        },
        "faults",
    )  # fmt: skip
    counter = WordCounter()
    sessions = prepare_sessions(config, counter)
    out = asyncio.run(run_benchmark(config, sessions, counter))
    summary = out.summary
    events = summary["fault_events"]
    assert [e["action"] for e in events] == ["transfer_fail", "kill_replica", "scale"]
    assert all(e["ok"] for e in events), events
    assert summary["failed"] == 0 and summary["completed"] == REQUESTS, events
    fail, kill, grow = events
    assert _moved(fail, "pdserve:transfer_failures_total") >= 1, json.dumps(events)
    assert _moved(kill, "pdserve:request_migrations_total") >= 1, json.dumps(events)
    assert "killed decode replica" in kill["detail"] and "Prefill -> 2" in grow["detail"]
    assert fail["recovery_s"] is not None, fail
    assert summary["ttft_breakdown"]["remote"]["count"] >= 1
    wait_until(lambda: len(app.running_replicas("Prefill")) == 2, 180, "the scale event took")
    brief = [
        {k: e[k] for k in ("action", "fired_s", "requests_failed", "recovery_s")} for e in events
    ]
    print(json.dumps({"fault_events": brief, "failed": summary["failed"]}))  # for the docs
