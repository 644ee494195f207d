"""The soak's prefix-hit-rate recovery: from cumulative routing counters sampled once a second,
the time after a fault until the windowed hit rate is back to 90% of what it was."""

from __future__ import annotations

from benchmarks.soak_faults import hit_rate_recovery_s


def samples(rates: list[float], blocks_per_s: float = 100.0) -> list[tuple[float, float, float]]:
    """Cumulative (time, cached, prompt) totals for one hit rate per second."""
    out, cached, prompt = [(0.0, 0.0, 0.0)], 0.0, 0.0
    for second, rate in enumerate(rates, start=1):
        cached += rate * blocks_per_s
        prompt += blocks_per_s
        out.append((float(second), cached, prompt))
    return out


def test_the_rate_dips_after_the_fault_and_the_recovery_is_when_it_is_back() -> None:
    # 40 s at 0.8, the index killed at t=40, 6 s of misses, then 0.8 again
    history = samples([0.8] * 40 + [0.0] * 6 + [0.8] * 30)
    recovery = hit_rate_recovery_s(history, at_s=40.0)
    assert recovery is not None and 6.0 <= recovery <= 7.0  # the misses ended 6 s after it


def test_no_dip_is_no_recovery_time_and_no_hits_before_is_unknown() -> None:
    assert hit_rate_recovery_s(samples([0.8] * 120), at_s=40.0) == 0.0
    assert hit_rate_recovery_s(samples([0.0] * 120), at_s=40.0) is None
    assert hit_rate_recovery_s(samples([0.8] * 40 + [0.0] * 80), at_s=40.0) is None
