"""The hot-prefix benchmark on a tiny simulated pool: every policy runs on the same requests
and the JSON line carries the issue's keys."""

from __future__ import annotations

import json

import pytest

from benchmarks.hot_prefix import POLICIES, main


def test_tiny_run_reports_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    report = main(["--requests", "400", "--system-tokens", "256", "--cache-blocks", "120"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == report
    for key in (
        "ttft_p99_ratio_vs_prefix",
        "ttft_p99_ratio_vs_sglang_style",
        "hit_rate_ratio_vs_prefix",
        "bytes_copied_per_request",
    ):
        assert isinstance(last[key], int | float) and last[key] >= 0
    policies = last["policies"]
    assert set(policies) == set(POLICIES)
    for figures in policies.values():
        assert 0.0 < figures["hit_rate"] <= 1.0  # system prompts are shared: some blocks hit
        assert figures["ttft_p99_ms"] >= figures["ttft_p50_ms"] > 0.0
    assert policies["round_robin"]["copies"] == 0  # only hot_prefix copies
