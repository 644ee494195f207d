"""Prefix heat: decayed request and token rates per chain head, queued tokens, top-K bounds."""

from __future__ import annotations

import math

import pytest

from cluster.routing.prefix_heat import PrefixHeat, prefix_head

HALF_LIFE_S = 10.0
DECAY_PER_S = math.log(2.0) / HALF_LIFE_S


def per_s(age_s: float) -> float:
    """A decayed count -> a rate, for a head first seen ``age_s`` ago (at least 1 s)."""
    return DECAY_PER_S / (1.0 - math.exp(-DECAY_PER_S * max(age_s, HALF_LIFE_S / 10)))


def test_prefix_head_names_the_first_blocks() -> None:
    assert prefix_head((11, 12, 13), head_blocks=2) == 12
    assert prefix_head((11,), head_blocks=2) == 11  # shorter prompts: all their blocks
    assert prefix_head((), head_blocks=1) is None


def test_rate_and_tokens_decay_by_half_life() -> None:
    heat = PrefixHeat(half_life_s=HALF_LIFE_S, max_prefixes=4)
    heat.record("a", 7, 100, now_s=0.0)
    heat.record("b", 7, 300, now_s=0.0)
    now = heat.reading(7, 0.0)
    assert now.rate_per_s == pytest.approx(2 * per_s(0.0))  # about 2 per second
    assert now.tokens_per_s == pytest.approx(400 * per_s(0.0))
    later = heat.reading(7, HALF_LIFE_S)
    assert later.rate_per_s == pytest.approx(2 * DECAY_PER_S)  # halved, over half the weight
    assert later.tokens_per_s == pytest.approx(400 * DECAY_PER_S)
    much_later = heat.reading(7, 10 * HALF_LIFE_S)
    assert much_later.rate_per_s == pytest.approx(2 / 1024 * per_s(10 * HALF_LIFE_S))
    assert heat.reading(8, 0.0).rate_per_s == 0.0  # untracked


def test_steady_arrivals_read_as_their_rate() -> None:
    heat = PrefixHeat(half_life_s=HALF_LIFE_S, max_prefixes=4)
    for i in range(2000):  # 20 requests per second for 100 s (ten half-lives)
        heat.record(f"r{i}", 7, 10, now_s=i * 0.05)
        if i == 40:  # two seconds in: already about right (bias-corrected)
            assert heat.reading(7, i * 0.05).rate_per_s == pytest.approx(20.0, rel=0.1)
    assert heat.reading(7, 2000 * 0.05).rate_per_s == pytest.approx(20.0, rel=0.05)


def test_queued_tokens_leave_when_requests_finish() -> None:
    heat = PrefixHeat(half_life_s=HALF_LIFE_S, max_prefixes=4)
    heat.record("a", 7, 100, now_s=0.0)
    heat.record("b", 7, 50, now_s=0.0)
    heat.record("b", 7, 50, now_s=0.0)  # a retried placement is queued once
    assert heat.reading(7, 1.0).num_queued_tokens == 150
    heat.finish("a")
    heat.finish("a")  # twice: no effect
    assert heat.reading(7, 1.0).num_queued_tokens == 50
    heat.finish("b")
    assert heat.reading(7, 1.0).num_queued_tokens == 0


def test_full_table_evicts_the_coldest_head() -> None:
    heat = PrefixHeat(half_life_s=HALF_LIFE_S, max_prefixes=2)
    for i in range(5):
        heat.record(f"hot{i}", 1, 10, now_s=0.0)
    heat.record("cold", 2, 10, now_s=0.0)
    heat.record("new", 3, 10, now_s=1.0)  # evicts 2, the coldest
    assert len(heat) == 2
    assert heat.reading(2, 1.0).rate_per_s == 0.0
    assert [r.head for r in heat.hottest(1.0, limit=2)] == [1, 3]


def test_in_flight_requests_are_bounded() -> None:
    heat = PrefixHeat(half_life_s=HALF_LIFE_S, max_prefixes=2, max_in_flight=3)
    for i in range(5):
        heat.record(f"r{i}", 1, 10, now_s=0.0)
    assert heat.reading(1, 0.0).num_queued_tokens == 30  # the two oldest were dropped


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        PrefixHeat(half_life_s=0.0, max_prefixes=1)
