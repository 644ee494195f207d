"""Arrival process: rate, burstiness (gamma shape), seeding, ramp-up."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pydantic import ValidationError

from loadtest.arrivals import arrival_times, rate_at
from loadtest.config import ArrivalConfig


def _gaps(cfg: ArrivalConfig, n: int, seed: int = 0) -> np.ndarray:
    times = list(itertools.islice(arrival_times(cfg, np.random.default_rng(seed)), n))
    return np.diff([0.0, *times])


def test_poisson_mean_and_cv() -> None:
    gaps = _gaps(ArrivalConfig(request_rate=20.0), 20000)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03)
    assert (gaps.std() / gaps.mean()) ** 2 == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_keeps_rate_and_sets_cv(burstiness: float) -> None:
    gaps = _gaps(ArrivalConfig(request_rate=10.0, burstiness=burstiness), 20000)
    assert gaps.mean() == pytest.approx(0.1, rel=0.04)
    assert (gaps.std() / gaps.mean()) ** 2 == pytest.approx(1 / burstiness, rel=0.08)


def test_infinite_rate_sends_everything_at_zero_and_infinite_burstiness_is_even() -> None:
    assert _gaps(ArrivalConfig(), 5).tolist() == [0.0] * 5
    even = _gaps(ArrivalConfig(request_rate=4.0, burstiness=float("inf")), 5)
    assert even.tolist() == pytest.approx([0.25] * 5)


def test_seeded_and_non_decreasing() -> None:
    cfg = ArrivalConfig(request_rate=5.0, burstiness=0.5)
    assert np.array_equal(_gaps(cfg, 100, seed=3), _gaps(cfg, 100, seed=3))
    assert not np.array_equal(_gaps(cfg, 100, seed=3), _gaps(cfg, 100, seed=4))
    assert (_gaps(cfg, 100) >= 0).all()


def test_linear_ramp_up_over_the_request_count() -> None:
    cfg = ArrivalConfig(
        ramp_up_strategy="linear", ramp_up_start_rps=2.0, ramp_up_end_rps=10.0, num_requests=9
    )
    assert [rate_at(cfg, p) for p in (0.0, 0.5, 1.0)] == [2.0, 6.0, 10.0]
    even = cfg.model_copy(update={"burstiness": float("inf")})
    assert _gaps(even, 3).tolist() == pytest.approx([1 / 2.0, 1 / 3.0, 1 / 4.0])


def test_exponential_ramp_up_and_validation() -> None:
    cfg = ArrivalConfig(ramp_up_strategy="exponential", ramp_up_start_rps=1, ramp_up_end_rps=16)
    assert rate_at(cfg, 0.5) == pytest.approx(4.0)
    with pytest.raises(ValidationError, match="either request_rate or a ramp-up"):
        ArrivalConfig(
            request_rate=3, ramp_up_strategy="linear", ramp_up_start_rps=1, ramp_up_end_rps=2
        )
    with pytest.raises(ValidationError, match="needs ramp_up_start_rps"):
        ArrivalConfig(ramp_up_strategy="linear")
