"""The expert placement plan: contiguous default, redundant copies, validation, agreement."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from engine.expert_parallel import ExpertPlacement


def test_contiguous_splits_experts_evenly_with_remainder_first() -> None:
    plan = ExpertPlacement.contiguous(8, 3)
    assert plan.num_ranks == 3
    assert [plan.experts_of(r) for r in range(3)] == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert ExpertPlacement.contiguous(4, 1).experts_of(0) == (0, 1, 2, 3)
    assert [plan.holders_of(e) for e in (0, 5, 7)] == [(0,), (1,), (2,)]


def test_redundant_copies_are_loaded_and_routed_round_robin() -> None:
    plan = ExpertPlacement.contiguous(4, 3, {0: [1, 2], 3: [0]})
    assert [plan.experts_of(r) for r in range(3)] == [(0, 1, 3), (0, 2), (0, 3)]
    assert plan.holders_of(0) == (0, 1, 2)
    assert plan.holders_of(3) == (2, 0)
    # A sender holding the expert keeps it local; others rotate the holders by their rank.
    assert plan.replica_table(0) == ((0,), (0,), (1,), (0,))
    assert plan.replica_table(1) == ((1,), (0,), (1,), (0, 2))
    assert plan.replica_table(2)[3] == (2,)
    assert ExpertPlacement.contiguous(4, 3, {3: [1]}).replica_table(0)[3] == (2, 1)


@pytest.mark.parametrize(
    ("kwargs", "param", "match"),
    [
        ({"num_experts": 4, "primary": ((0, 1), (2,))}, "primary", r"missing \[3\]"),
        ({"num_experts": 3, "primary": ((0, 1), (1, 2))}, "primary", r"several ranks \[1\]"),
        ({"num_experts": 2, "primary": ((0, 1), ())}, "primary", "rank 1 owns no expert"),
        ({"num_experts": 2, "primary": ((0, 5),)}, "expert_ids", r"\[5\] outside 0..1"),
        ({"num_experts": 0, "primary": ()}, "num_experts", ">= 1 expert"),
        (
            {"num_experts": 2, "primary": ((0,), (1,)), "redundant": ((0,), ())},
            "redundant",
            "rank 0 holds an expert twice",
        ),
        (
            {"num_experts": 2, "primary": ((0,), (1,)), "redundant": ((1, 1), ())},
            "redundant",
            "twice",
        ),
        (
            {"num_experts": 2, "primary": ((0,), (1,)), "redundant": ((1,),)},
            "redundant",
            "lists 1 ranks",
        ),
    ],
)
def test_invalid_plans_are_refused(kwargs: dict, param: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        ExpertPlacement(**kwargs)
    assert err.value.param == param


def test_contiguous_refuses_more_ranks_than_experts_and_bad_copies() -> None:
    with pytest.raises(ConfigError, match="rank 2 owns no expert"):
        ExpertPlacement.contiguous(2, 3)
    with pytest.raises(ConfigError, match="expert_parallel must be >= 1"):
        ExpertPlacement.contiguous(2, 0)
    with pytest.raises(ConfigError, match=r"on rank 4, outside 0\.\.1"):
        ExpertPlacement.contiguous(4, 2, {0: [4]})
    with pytest.raises(ConfigError, match=r"outside 0\.\.1") as err:
        ExpertPlacement.contiguous(4, 2).experts_of(2)
    assert err.value.param == "rank"


def test_hot_copies_go_to_the_least_loaded_rank_lacking_the_expert() -> None:
    plan = ExpertPlacement.contiguous(4, 2)  # rank 0: 0, 1; rank 1: 2, 3
    load = [100, 10, 5, 5]
    assert plan.expected_load(load) == [110.0, 10.0]
    hot = plan.with_hot_copies(load, 1)
    assert hot.redundant == ((), (0,))
    assert hot.expected_load(load) == [60.0, 60.0]
    # The second-hottest (1) then goes to the now less-loaded rank lacking it: rank 1.
    assert plan.with_hot_copies(load, 2).redundant == ((), (0, 1))
    # With one rank, nothing can be copied.
    assert ExpertPlacement.contiguous(2, 1).with_hot_copies([3, 1], 2).redundant == ((),)
    with pytest.raises(ConfigError, match="load for 3 experts"):
        plan.with_hot_copies([1, 2, 3], 1)


def test_json_round_trip_and_fingerprint() -> None:
    plan = ExpertPlacement.contiguous(6, 2, {5: [0]})
    again = ExpertPlacement.from_json(plan.to_json())
    assert again == plan
    assert again.fingerprint() == plan.fingerprint()
    assert 0 <= plan.fingerprint() < 2**62
    assert ExpertPlacement.contiguous(6, 2).fingerprint() != plan.fingerprint()
    with pytest.raises(ConfigError, match="malformed expert placement") as err:
        ExpertPlacement.from_json('{"num_experts": 2}')
    assert err.value.param == "placement"
    with pytest.raises(ConfigError, match="every expert"):
        ExpertPlacement.from_json(
            '{"num_experts": 3, "primary": [[0], [1]], "redundant": [[], []]}'
        )
