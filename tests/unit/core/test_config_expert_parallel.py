"""A pool's ``expert_parallel``: replicas come in whole gangs, fixed or autoscaled."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from core.config import ClusterConfig, PoolConfig


def pool(**fields: Any) -> PoolConfig:
    return PoolConfig.model_validate(fields)


def test_default_is_no_expert_parallelism() -> None:
    assert pool().expert_parallel == 1
    assert pool().ep_timeout_s == 60.0
    assert pool(num_replicas=3).initial_replicas == 3  # any count without gangs


@pytest.mark.parametrize(
    "fields",
    [
        {"expert_parallel": 2, "num_replicas": 2},
        {"expert_parallel": 2, "num_replicas": 4, "ep_timeout_s": 5.0},
        {"expert_parallel": 2, "autoscaling": {"min_replicas": 2, "max_replicas": 6}},
        {"expert_parallel": 4, "autoscaling": {"min_replicas": 0, "max_replicas": 8}},
    ],
)
def test_whole_gangs_are_accepted(fields: dict[str, Any]) -> None:
    config = pool(**fields)
    assert config.initial_replicas % config.expert_parallel == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"expert_parallel": 2, "num_replicas": 3}, "num_replicas (3) must be a multiple"),
        ({"expert_parallel": 2}, "needs num_replicas"),
        (
            {"expert_parallel": 2, "autoscaling": {"min_replicas": 2, "max_replicas": 5}},
            "autoscaling.max_replicas (5)",
        ),
        (
            {
                "expert_parallel": 2,
                "autoscaling": {"min_replicas": 2, "max_replicas": 4, "initial_replicas": 3},
            },
            "autoscaling.initial_replicas (3)",
        ),
        ({"expert_parallel": 0, "num_replicas": 2}, "greater than or equal to 1"),
        ({"expert_parallel": 2, "num_replicas": 2, "ep_timeout_s": 0}, "greater than 0"),
    ],
)
def test_partial_gangs_and_bad_values_are_rejected(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        pool(**fields)


def test_pools_choose_expert_parallelism_independently() -> None:
    config = ClusterConfig.model_validate(
        {
            "model": {"name": "builtin:tiny-moe"},
            "prefill": {"num_replicas": 2, "expert_parallel": 2},
            "decode": {"num_replicas": 1},
        }
    )
    assert (config.prefill.expert_parallel, config.decode.expert_parallel) == (2, 1)
    assert all(field.description for field in PoolConfig.model_fields.values())


def test_compiled_engine_and_expert_parallelism_are_exclusive_per_pool() -> None:
    base = {"model": {"name": "builtin:tiny-moe"}, "decode": {"num_replicas": 1}}
    compiled_decode = {
        **base,
        "prefill": {"num_replicas": 2, "expert_parallel": 2},
        "decode": {"num_replicas": 1, "engine": {"compile_model": True}},
    }
    config = ClusterConfig.model_validate(compiled_decode)  # the EP pool is not compiled
    assert config.engine_for("decode").compile_model
    assert not config.engine_for("prefill").compile_model
    with pytest.raises(ValidationError, match=re.escape("prefill: engine.compile_model")):
        ClusterConfig.model_validate(
            {
                **base,
                "engine": {"compile_model": True},
                "prefill": {"num_replicas": 2, "expert_parallel": 2},
            }
        )


def test_eplb_defaults_to_off() -> None:
    config = pool()
    assert config.eplb.redundant_experts == 0
    assert config.eplb.rebalance_interval_steps == 256


def test_eplb_on_a_gang_is_accepted() -> None:
    config = pool(
        expert_parallel=2,
        num_replicas=2,
        eplb={"redundant_experts": 4, "rebalance_interval_steps": 32},
    )
    assert config.eplb.redundant_experts == 4
    assert config.eplb.rebalance_interval_steps == 32


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"eplb": {"redundant_experts": 2}},
            "eplb.redundant_experts (2) needs expert_parallel > 1",
        ),
        (
            {"expert_parallel": 2, "num_replicas": 2, "eplb": {"redundant_experts": -1}},
            "eplb.redundant_experts",
        ),
        (
            {"expert_parallel": 2, "num_replicas": 2, "eplb": {"rebalance_interval_steps": 0}},
            "eplb.rebalance_interval_steps",
        ),
        (
            {"expert_parallel": 2, "num_replicas": 2, "eplb": {"redundant": 2}},
            "eplb.redundant",
        ),
    ],
)
def test_bad_eplb_is_rejected_naming_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        pool(**fields)


def test_tensor_parallel_pools_of_any_sizes_pair_up() -> None:
    """Prefill and decode pools of different TP sizes are accepted (KV moves head by head);
    GPUs that are not one per rank, or TP with expert parallelism, are refused naming why."""
    base = {"model": {"name": "builtin:tiny-llama"}}
    tp_decode = {"engine": {"tensor_parallel_size": 2}, "num_replicas": 1, "num_gpus": 2}
    tp_prefill = {"engine": {"tensor_parallel_size": 4}, "num_replicas": 1}
    config = ClusterConfig.model_validate({**base, "prefill": tp_prefill, "decode": tp_decode})
    assert config.engine_for("decode").tensor_parallel_size == 2
    assert config.engine_for("prefill").tensor_parallel_size == 4
    refusals = [
        (
            {"prefill": {"num_replicas": 0}, "decode": {**tp_decode, "num_gpus": 1}},
            "decode.num_gpus (1) must equal decode.engine.tensor_parallel_size (2)",
        ),
        (
            {"prefill": {**tp_prefill, "num_replicas": 2, "expert_parallel": 2}},
            "prefill: engine.tensor_parallel_size (4) cannot be combined with expert_parallel",
        ),
    ]
    for pools, message in refusals:
        with pytest.raises(ValidationError, match=re.escape(message)):
            ClusterConfig.model_validate({**base, **pools})
