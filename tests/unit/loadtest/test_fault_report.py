"""A fault schedule's report from synthetic runs: failures go to the event before them,
recovery is judged against the SLO (or the pre-fault baseline), counter deltas run from one
event to the next; the schedule's config is checked; ``/metrics`` counters parse."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from loadtest.config import FaultControlConfig, FaultEventConfig, LoadTestConfig, SloConfig
from loadtest.fault_report import fault_report, latency_targets, recovery_s
from loadtest.fault_schedule import FiredEvent, parse_counters
from loadtest.types import RequestRecord

KILL = FaultEventConfig(at_s=2.0, action="kill_replica", pool="decode")
STALL = FaultEventConfig(at_s=5.0, action="transfer_stall", duration_s=2.0)


def record(
    start_s: float, ttft_s: float, *, ok: bool = True, latency_s: float = 0.5
) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{start_s}", session_id=0, turn_index=0, success=ok, start_s=start_s,
        queue_s=0.0, prompt_tokens=8, output_tokens=4 if ok else 0, ttft_s=ttft_s,
        latency_s=latency_s, itl_s=(0.01, 0.01, 0.01) if ok else (),
    )  # fmt: skip


def test_failures_recovery_and_counters() -> None:
    # steady 0.1 s TTFT, slow right after the kill, failures after the stall, then healthy
    records = [record(t / 4, 0.1) for t in range(8)]  # 0 .. 1.75 s: the baseline
    records += [record(2.0 + t / 4, 1.0) for t in range(8)]  # 2 .. 3.75 s: slow after the kill
    records += [record(4.0 + t / 4, 0.1) for t in range(4)]  # 4 .. 4.75 s: healthy again
    records += [record(5.5, 0.0, ok=False), record(6.0, 0.0, ok=False)]  # during the stall
    records += [record(7.0 + t / 4, 0.1) for t in range(8)]  # 7 .. 8.75 s: after the stall
    fired = [
        FiredEvent(
            0,
            KILL,
            2.0,
            True,
            "killed",
            {'pdserve:request_migrations_total{reason="replica_failed"}': 1.0},
        ),
        FiredEvent(
            1,
            STALL,
            5.0,
            True,
            "stalled",
            {'pdserve:request_migrations_total{reason="replica_failed"}': 3.0},
        ),
    ]
    final = {
        'pdserve:request_migrations_total{reason="replica_failed"}': 3.0,
        'pdserve:transfer_failures_total{reason="timeout",role="import"}': 2.0,
    }
    control = FaultControlConfig(recovery_window_s=1.0)
    report = fault_report(fired, final, records, SloConfig(), control)
    kill, stall = report["fault_events"]
    assert report["failed_before_events"] == 0
    assert (kill["requests_failed"], stall["requests_failed"]) == (0, 2)
    # baseline p90 TTFT 0.1 s -> target 0.2 s: the kill's window is clean again from 4.0 s
    assert kill["recovery_s"] == pytest.approx(2.0)
    assert stall["recovery_s"] == pytest.approx(0.0)  # from 7.0 s, its effect's end
    assert kill["counters"] == {'pdserve:request_migrations_total{reason="replica_failed"}': 2.0}
    assert stall["counters"] == {
        'pdserve:transfer_failures_total{reason="timeout",role="import"}': 2.0
    }
    assert kill["ok"] and kill["pool"] == "decode" and stall["action"] == "transfer_stall"


def test_targets_prefer_the_slo_and_recovery_can_fail() -> None:
    records = [record(t / 4, 2.0) for t in range(12)]
    assert latency_targets(records, SloConfig(ttft_ms=500, tpot_ms=50), 1.0) == (0.5, 0.05)
    assert latency_targets(records[:1], SloConfig(), 1.0) is None  # too little baseline
    assert recovery_s(records, 1.0, (0.5, 0.05), 1.0) is None  # never within 0.5 s
    assert fault_report([], {}, records, SloConfig(), FaultControlConfig()) == {
        "fault_events": [],
        "failed_before_events": 0,
    }


def test_parse_counters_keeps_pdserve_counters_only() -> None:
    text = (
        "# HELP pdserve:request_migrations Migrations.\n"
        "# TYPE pdserve:request_migrations counter\n"
        'pdserve:request_migrations_total{reason="timeout"} 2.0\n'
        'pdserve:request_migrations_created{reason="timeout"} 1.7e9\n'
        "# HELP other_total Not ours.\n# TYPE other_total counter\nother_total 5.0\n"
        "# HELP pdserve:request_success_total Done.\n"
        "# TYPE pdserve:request_success_total counter\npdserve:request_success_total 4.0\n"
        "# HELP pdserve:kv_blocks_used Gauge.\n# TYPE pdserve:kv_blocks_used gauge\n"
        "pdserve:kv_blocks_used 3.0\n"
        "# HELP pdserve:kv_blocks_total A gauge despite its name.\n"
        "# TYPE pdserve:kv_blocks_total gauge\npdserve:kv_blocks_total 512.0\n"
    )
    assert parse_counters(text) == {
        'pdserve:request_migrations_total{reason="timeout"}': 2.0,
        "pdserve:request_success_total{}": 4.0,
    }


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"at_s": 1, "action": "kill_replica"}, "kill_replica needs a pool"),
        ({"at_s": 1, "action": "scale", "pool": "prefill"}, "scale needs replicas"),
        ({"at_s": 1, "action": "scale", "pool": "decode", "replicas": 0}, "at least one"),
        ({"at_s": -1, "action": "transfer_fail"}, "greater than or equal to 0"),
        ({"at_s": 1, "action": "reboot"}, "action"),
    ],
)
def test_bad_events_are_named(event: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LoadTestConfig.model_validate({"events": [event]})


def test_a_schedule_does_not_sweep() -> None:
    with pytest.raises(ValidationError, match="runs once"):
        LoadTestConfig.model_validate(
            {"events": [{"at_s": 1, "action": "transfer_fail"}], "sweep": {"mode": "rate"}}
        )
