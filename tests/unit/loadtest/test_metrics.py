"""Summary metrics against hand-computed values (vLLM's definitions and field names)."""

from __future__ import annotations

import pytest

from loadtest.config import SloConfig
from loadtest.summary import is_good, peak_stats, percentile_key, summarize
from loadtest.types import FailureKind, RequestRecord


def _ok(rid: int, start: float, ttft: float, itl: list[float], prompt: int = 10) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{rid}",
        session_id=rid,
        turn_index=0,
        success=True,
        start_s=start,
        queue_s=0.0,
        prompt_tokens=prompt,
        output_tokens=len(itl) + 1,
        ttft_s=ttft,
        latency_s=ttft + sum(itl),
        itl_s=tuple(itl),
    )


def _failed(rid: int, kind: FailureKind) -> RequestRecord:
    return RequestRecord(
        request_id=f"f{rid}",
        session_id=rid,
        turn_index=0,
        success=False,
        start_s=0.0,
        queue_s=0.0,
        prompt_tokens=999,
        output_tokens=0,
        ttft_s=5.0,
        latency_s=9.0,
        failure_kind=kind,
    )


RECORDS = [
    _ok(0, 0.0, 0.100, [0.010, 0.020, 0.030]),  # 4 tokens, e2el 0.160, tpot 0.020
    _ok(1, 0.5, 0.200, [0.040]),  # 2 tokens, e2el 0.240, tpot 0.040
    _ok(2, 1.2, 0.300, []),  # 1 token: no TPOT sample, TPOT 0 for goodput
    _failed(3, FailureKind.TRUNCATED),
    _failed(4, FailureKind.HTTP_STATUS),
    _failed(5, FailureKind.TRUNCATED),
]


def test_counts_throughput_and_failures() -> None:
    s = summarize(RECORDS, duration_s=2.0, slo=SloConfig())
    assert s["completed"] == 3
    assert s["failed"] == 3
    assert s["failures_by_kind"] == {"http_status": 1, "truncated": 2}
    assert s["total_input_tokens"] == 30  # failed requests' prompts do not count
    assert s["total_output_tokens"] == 7
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_throughput"] == pytest.approx(3.5)
    assert s["total_token_throughput"] == pytest.approx(18.5)
    assert s["request_goodput"] is None


def test_latency_statistics_follow_vllm_definitions() -> None:
    s = summarize(RECORDS, duration_s=2.0, slo=SloConfig(), percentiles=(50.0, 99.0))
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["std_ttft_ms"] == pytest.approx(81.6496580927726)
    # TPOT = (e2el - ttft) / (n - 1): 0.060/3 and 0.040/1; the 1-token request has no sample.
    assert s["mean_tpot_ms"] == pytest.approx(30.0)
    # ITL pools every gap of every request.
    assert s["mean_itl_ms"] == pytest.approx(25.0)
    assert s["median_itl_ms"] == pytest.approx(25.0)
    assert s["mean_e2el_ms"] == pytest.approx((160 + 240 + 300) / 3)
    assert s["p50_ttft_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(298.0)  # numpy linear interpolation
    assert s["p99_itl_ms"] == pytest.approx(39.7)


def test_percentile_metrics_select_which_get_percentiles() -> None:
    s = summarize(RECORDS, 2.0, SloConfig(), percentiles=(90.0, 99.9), percentile_metrics=("itl",))
    assert "p90_itl_ms" in s
    assert "p99.9_itl_ms" in s
    assert "p90_ttft_ms" not in s
    assert "mean_ttft_ms" in s  # mean/median/std are always reported
    assert percentile_key("ttft", 99.0) == "p99_ttft_ms"
    assert percentile_key("tpot", 99.5) == "p99.5_tpot_ms"


def test_goodput_counts_requests_meeting_every_slo() -> None:
    # TTFT <= 250 ms keeps requests 0 and 1; TPOT <= 30 ms then drops request 1 (40 ms).
    assert summarize(RECORDS, 2.0, SloConfig(ttft_ms=250))["request_goodput"] == 1.0
    both = SloConfig(ttft_ms=250, tpot_ms=30)
    assert summarize(RECORDS, 2.0, both)["request_goodput"] == 0.5
    # The 1-token request has TPOT 0, so a TPOT bound alone keeps it.
    assert [is_good(r, SloConfig(tpot_ms=25)) for r in RECORDS[:3]] == [True, False, True]
    assert not any(is_good(r, SloConfig(e2el_ms=1e9)) for r in RECORDS[3:])


def test_no_success_reports_zeros_not_errors() -> None:
    s = summarize(RECORDS[3:], 1.0, SloConfig(ttft_ms=100))
    assert s["completed"] == 0
    assert s["mean_ttft_ms"] == 0.0
    assert s["request_goodput"] == 0.0
    assert s["max_concurrent_requests"] == 0


def test_peak_stats() -> None:
    # Requests 0 [0, 0.16) and 1 [0.5, 0.74) never overlap; 2 starts at 1.2.
    max_tokens_per_s, peak = peak_stats(RECORDS)
    assert peak == 1
    assert max_tokens_per_s == 6.0  # tokens of requests 0 and 1 all land in second 0
    overlapping = [_ok(0, 0.0, 0.1, [0.5]), _ok(1, 0.2, 0.1, [0.5]), _ok(2, 0.3, 0.1, [])]
    assert peak_stats(overlapping)[1] == 3
