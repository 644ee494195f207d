"""The server's TTFT breakdown (``usage.ttft_breakdown``) reaches each record, the summary
(per prefill path) and a stacked plot; a malformed or missing one is left out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from loadtest.server_timing import (
    STAGES,
    ServerTiming,
    breakdown_summary,
    write_breakdown_plot,
)
from tests.unit.loadtest.fake_server import FakeBehaviour

BREAKDOWN = {
    "path": "remote", "ttft_ms": 30.0, "dispatch_ms": 2.0, "queue_ms": 5.0, "prefill_ms": 20.0,
    "export_ms": 3.0, "transfer_ms": 7.0, "first_decode_ms": 4.0,
}  # fmt: skip


def test_parse_reads_every_stage_and_refuses_malformed_ones() -> None:
    timing = ServerTiming.parse({"ttft_breakdown": BREAKDOWN})
    assert timing is not None and timing.path == "remote" and timing.ttft_ms == 30.0
    assert [timing.stage_ms(s) for s in STAGES] == [2.0, 5.0, 20.0, 3.0, 7.0, 4.0]
    assert ServerTiming.parse({}) is None
    assert ServerTiming.parse({"ttft_breakdown": {**BREAKDOWN, "queue_ms": "x"}}) is None
    assert ServerTiming.parse({"ttft_breakdown": {"path": "local"}}) is None


def test_summary_is_per_path() -> None:
    remote = ServerTiming("remote", 30.0, (2.0, 5.0, 20.0, 3.0, 7.0, 4.0))
    slow = ServerTiming("remote", 50.0, (2.0, 25.0, 20.0, 3.0, 7.0, 4.0))
    local = ServerTiming("local", 10.0, (1.0, 1.0, 8.0, 0.0, 0.0, 0.0))
    summary = breakdown_summary([remote, slow, local])
    assert summary["remote"]["count"] == 2 and summary["local"]["count"] == 1
    assert summary["remote"]["mean_queue_ms"] == 15.0
    assert summary["remote"]["mean_ttft_ms"] == 40.0
    assert summary["local"]["p90_transfer_ms"] == 0.0
    assert breakdown_summary([]) == {}


def test_a_run_reports_the_breakdown(
    fake_server: Callable, run_bench: Callable, tmp_path: Path
) -> None:
    _server, url = fake_server(FakeBehaviour(ttft_s=0.01, itl_s=0.002, ttft_breakdown=BREAKDOWN))
    out = run_bench(url, arrivals={"num_requests": 4})
    assert out.summary["ttft_breakdown"]["remote"]["count"] == 4
    assert out.summary["ttft_breakdown"]["remote"]["mean_transfer_ms"] == pytest.approx(7.0)
    timings = [r.server_timing for r in out.records]
    assert all(t is not None and t.stage_ms("prefill") == 20.0 for t in timings)
    png = write_breakdown_plot([r.start_s for r in out.records], timings, tmp_path / "b.png")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
    assert write_breakdown_plot([], [], tmp_path / "none.png") is None


def test_a_server_without_the_breakdown_leaves_it_out(
    fake_server: Callable, run_bench: Callable
) -> None:
    _server, url = fake_server(FakeBehaviour(ttft_s=0.01, itl_s=0.002))
    out = run_bench(url, arrivals={"num_requests": 2})
    assert "ttft_breakdown" not in out.summary
    assert all(r.server_timing is None for r in out.records)
