"""``benchmarks/rolling_upgrade.py`` runs end to end on the CPU: one prefill and two decode
replicas upgraded to other weights under load, with the issue's JSON keys — no failed request,
no mixed output, the ratio held, no ``/dev/shm`` segment left behind."""

from __future__ import annotations

import json

import pytest

from benchmarks.rolling_upgrade import main

pytestmark = pytest.mark.timeout(180)


def test_the_benchmark_prints_its_keys_and_a_clean_upgrade(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--clients", "2", "--warmup-requests", "6", "--max-tokens", "4"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["requests_failed"] == 0
    assert result["mixed_version_outputs"] == 0
    assert result["max_pd_ratio_deviation"] <= 1.0
    assert result["shm_segments_left"] == 0
    assert result["upgrade_s"] > 0 and result["p99_ttft_during_over_before"] is not None
