"""benchmarks/multi_lora.py on the tiny model, shortened: the JSON line last carries every key,
and adapter-aware routing lands more requests on a replica holding their adapter than blind."""

from __future__ import annotations

import json

import pytest

from benchmarks import multi_lora

pytestmark = pytest.mark.timeout(300)

KEYS = {
    "model",
    "base_tpot_ms",
    "mixed_tpot_ms",
    "mixed_batch_tpot_ratio",
    "mixed_batch_cpu_time_ratio",
    "adapter_aware_hit_rate",
    "adapter_blind_hit_rate",
    "adapter_routing_hit_ratio",
    "adapter_load_ms",
}


def test_a_short_run_prints_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    short = "--batch 2 --tokens 3 --prompt-tokens 8 --repeats 1 --rank 8"
    small = "--adapters 6 --max-cpu-loras 4 --requests 120"
    multi_lora.main(f"{short} {small}".split())
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == KEYS
    assert result["adapter_aware_hit_rate"] > result["adapter_blind_hit_rate"]
    assert result["mixed_tpot_ms"] > 0 and result["base_tpot_ms"] > 0
    assert result["adapter_load_ms"] > 0
