"""benchmarks/speculative.py on the tiny model, shortened: every key present, greedy identical,
an unknown method reported rather than fatal."""

from __future__ import annotations

from benchmarks import speculative


def test_one_short_run_reports_every_key() -> None:
    result = speculative.run("builtin:tiny-llama", ["ngram", "eagle"], k=3, max_tokens=4, batch=2)
    assert result["greedy_identical"] is True
    assert "method: Input should be" in result["unavailable_eagle"]
    assert result["headline_method"] == "ngram"
    for workload in speculative.WORKLOADS:
        assert result[f"acceptance_length_{workload}_ngram"] >= 1.0
        assert result[f"spec_tpot_b1_ratio_{workload}"] > 0.0
    assert result["spec_throughput_b32_ratio"] > 0.0
    assert set(result["met"]) == set(speculative.TARGETS)
    assert result["met"]["greedy_identical"] is True
