"""Every way a request can fail is classified and never counted as a success."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadtest.types import FailureKind
from tests.unit.loadtest.fake_server import FakeBehaviour

EXPECTED_KIND = {
    "http_500": FailureKind.HTTP_STATUS,
    "http_429": FailureKind.HTTP_STATUS,
    "sse_error": FailureKind.SSE_ERROR,
    "sse_error_event": FailureKind.SSE_ERROR,
    "truncate": FailureKind.TRUNCATED,
    "drop": FailureKind.TRUNCATED,
    "garbage": FailureKind.INVALID,
    "empty": FailureKind.EMPTY,
}


def test_faults_are_classified_by_kind(fake_server: Callable, run_bench: Callable) -> None:
    faults = {1: "http_500", 2: "http_429", 3: "sse_error", 4: "sse_error_event"}
    faults |= {5: "truncate", 6: "drop", 7: "garbage", 8: "empty"}
    _server, url = fake_server(FakeBehaviour(ttft_s=0.005, itl_s=0.002, faults=faults))
    # One request at a time, so the server's arrival index is the dispatch order.
    out = run_bench(url, arrivals={"num_requests": 10, "max_concurrency": 1})
    records = sorted(out.records, key=lambda r: r.start_s)
    assert len(records) == 10
    for index, record in enumerate(records):
        fault = faults.get(index)
        if fault is None:
            assert record.success and record.failure_kind is None
            assert record.output_tokens == 8
        else:
            assert not record.success, fault
            assert record.failure_kind is EXPECTED_KIND[fault], fault
            assert record.output_tokens == 0
    assert records[1].http_status == 500 and "injected http_500" in records[1].error
    assert records[2].http_status == 429
    assert "mid-stream error" in records[3].error
    s = out.summary
    assert s["completed"] == 2 and s["failed"] == 8
    assert s["failures_by_kind"] == {
        "empty_stream": 1,
        "http_status": 2,
        "invalid_response": 1,
        "sse_error": 2,
        "truncated": 2,
    }
    assert s["total_output_tokens"] == 16  # only the two successes' tokens


def test_timeout_bounds_a_stalled_request(fake_server: Callable, run_bench: Callable) -> None:
    _server, url = fake_server(FakeBehaviour(ttft_s=0.005, itl_s=0.001, faults={0: "stall"}))
    out = run_bench(url, arrivals={"num_requests": 2}, target={"request_timeout_s": 0.4})
    assert out.summary["duration"] < 5.0  # on the run's clock: the 30 s stall was cut short
    kinds = sorted((r.failure_kind.value if r.failure_kind else "ok") for r in out.records)
    assert kinds == ["ok", "timeout"]


def test_connection_refused(closed_port_url: str, run_bench: Callable) -> None:
    out = run_bench(closed_port_url, arrivals={"num_requests": 3}, target={"model": "m"})
    assert out.summary["completed"] == 0
    assert out.summary["failures_by_kind"] == {"connection_error": 3}
    assert all(not r.success for r in out.records)


def test_model_defaults_to_the_servers_first(fake_server: Callable, run_bench: Callable) -> None:
    server, url = fake_server(FakeBehaviour(ttft_s=0.001, itl_s=0.001, model="served-x"))
    out = run_bench(url, arrivals={"num_requests": 2})
    assert out.model == "served-x"
    assert {r.body["model"] for r in server.received} == {"served-x"}
    body: dict[str, Any] = server.received[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8 and "ignore_eos" not in body
