"""The load balancer's plan: exact copies for known loads, the balance it reaches, determinism."""

from __future__ import annotations

import random

import pytest

from core.errors import ConfigError
from engine.expert_parallel import ExpertPlacement, max_mean_load_ratio, rebalance_placement

BASE = ExpertPlacement.contiguous(8, 2)  # rank 0: experts 0-3, rank 1: experts 4-7


@pytest.mark.parametrize(
    ("load", "num_copies", "redundant", "rank_load"),
    [
        # the two hot experts of rank 0 get a copy on rank 1
        ([100, 80, 5, 5, 5, 5, 5, 5], 2, ((), (0, 1)), [100.0, 110.0]),
        # then rank 1 is the busier one: two of its experts come back to rank 0
        ([100, 80, 5, 5, 5, 5, 5, 5], 4, ((4, 5), (0, 1)), [105.0, 105.0]),
        # balanced already: no copy helps, the budget stays unused
        ([10] * 8, 2, ((), ()), [40.0, 40.0]),
        # one copy: the hottest of rank 1's experts
        ([0, 0, 0, 0, 50, 50, 0, 0], 1, ((4,), ()), [25.0, 75.0]),
        # cold experts never get a copy
        ([0, 0, 0, 0, 50, 0, 0, 0], 3, ((4,), ()), [25.0, 25.0]),
    ],
)
def test_exact_copies_for_known_loads(
    load: list[int],
    num_copies: int,
    redundant: tuple[tuple[int, ...], ...],
    rank_load: list[float],
) -> None:
    plan = rebalance_placement(BASE, load, num_copies)
    assert plan.primary == BASE.primary  # primaries never move
    assert plan.redundant == redundant
    assert plan.expected_load(load) == rank_load


def test_four_ranks_spread_two_hot_experts() -> None:
    base = ExpertPlacement.contiguous(8, 4)  # rank 0 holds both hot experts
    load = [400, 300, 10, 10, 10, 10, 10, 10]
    plan = rebalance_placement(base, load, 4)
    assert plan.redundant == ((), (0, 1), (1,), (0,))
    before = max_mean_load_ratio(base.expected_load(load))
    after = max_mean_load_ratio(plan.expected_load(load))
    assert before == pytest.approx(700 / 190)
    assert after == pytest.approx((760 / 3) / 190)


@pytest.mark.parametrize("seed", range(20))
def test_balance_never_worse_and_copies_within_budget(seed: int) -> None:
    rng = random.Random(seed)
    num_ranks = rng.choice([2, 3, 4])
    base = ExpertPlacement.contiguous(rng.choice([8, 12, 16]), num_ranks)
    load = [int(rng.paretovariate(1.2) * 10) for _ in range(base.num_experts)]
    num_copies = rng.randrange(0, base.num_experts)
    plan = rebalance_placement(base, load, num_copies)
    assert sum(len(ids) for ids in plan.redundant) <= num_copies
    before = max(base.expected_load(load))
    after = max(plan.expected_load(load))
    assert after <= before + 1e-9
    # the busiest rank is within one hottest expert's share of the mean
    mean = sum(load) / num_ranks
    assert after <= mean + max(load)


def test_two_ranks_one_copy_per_hot_expert_reaches_even_split() -> None:
    load = [1000, 900, 800, 1, 1, 1, 1, 1]  # three hot experts, all on rank 0
    plan = rebalance_placement(BASE, load, 3)
    assert plan.redundant == ((), (0, 1, 2))
    assert max_mean_load_ratio(plan.expected_load(load)) <= 1.01


def test_plan_is_deterministic_down_to_the_fingerprint() -> None:
    load = [7, 7, 7, 3, 3, 9, 9, 1]  # ties broken by expert id, then rank
    plans = {rebalance_placement(BASE, list(load), 4).fingerprint() for _ in range(5)}
    assert len(plans) == 1
    assert rebalance_placement(BASE, load, 4) == rebalance_placement(BASE, tuple(load), 4)


def test_base_copies_are_replaced_not_added_to() -> None:
    base = ExpertPlacement.contiguous(8, 2, redundant={7: [0]})
    plan = rebalance_placement(base, [100, 0, 0, 0, 0, 0, 0, 0], 1)
    assert plan.redundant == ((), (0,))


@pytest.mark.parametrize(
    ("load", "num_copies", "param"),
    [
        ([1] * 7, 1, "tokens_per_expert"),
        ([1, -1, 1, 1, 1, 1, 1, 1], 1, "tokens_per_expert"),
        ([1] * 8, -1, "eplb.redundant_experts"),
        ([1] * 8, 9, "eplb.redundant_experts"),  # 8 experts x 1 other rank at most
    ],
)
def test_invalid_inputs_name_the_field(load: list[int], num_copies: int, param: str) -> None:
    with pytest.raises(ConfigError) as info:
        rebalance_placement(BASE, load, num_copies)
    assert info.value.param == param
    assert param.rsplit(".", maxsplit=1)[-1] in info.value.message


def test_max_mean_load_ratio() -> None:
    assert max_mean_load_ratio([3.0, 1.0]) == 1.5
    assert max_mean_load_ratio([2.0, 2.0]) == 1.0
    assert max_mean_load_ratio([0.0, 0.0]) == 0.0
