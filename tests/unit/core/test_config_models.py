"""Several models in one cluster YAML: both forms resolve to served models; bad YAML is refused
with the field named."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.config import ClusterConfig, pool_key, split_pool_key
from core.config.models import served_names

SMALL = {"name": "builtin:tiny-llama", "served_name": "small"}
LARGE = {"name": "builtin:tiny-moe", "served_name": "large"}


def two_models(**extra: Any) -> dict[str, Any]:
    return {
        "models": [
            {"model": SMALL, "prefill": {"num_replicas": 0}},
            {"model": LARGE, "engine": {"max_num_seqs": 4}, "decode": {"num_replicas": 2}},
        ],
        "engine": {"block_size": 32, "max_num_seqs": 8},
        **extra,
    }


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        ClusterConfig.model_validate(data)
    return str(info.value)


def test_the_one_model_form_is_a_list_of_one_with_the_plain_pool_names() -> None:
    config = ClusterConfig.model_validate({"model": SMALL, "prefill": {"num_replicas": 2}})
    (served,) = config.served_models()
    assert served.scope == "" and served.name == "small"
    assert served.pool_key("decode") == "decode" and served.prefill.num_replicas == 2
    assert config.primary == served and config.pool_for("prefill") is config.prefill


def test_models_resolve_with_engine_options_merged_in_order() -> None:
    config = ClusterConfig.model_validate(two_models())
    small, large = config.served_models()
    assert (small.scope, large.scope) == ("small", "large")
    assert small.pool_key("prefill") == "prefill/small"
    assert small.engine_for("decode").max_num_seqs == 8  # the top-level engine section
    assert large.engine_for("decode").max_num_seqs == 4  # the model's own override
    assert large.engine_for("decode").block_size == 32  # kept from the top level
    assert large.decode.num_replicas == 2 and not small.prefill.deployed


def test_pool_keys_round_trip() -> None:
    assert split_pool_key(pool_key("decode", "m-1")) == ("decode", "m-1")
    assert split_pool_key(pool_key("prefill", "")) == ("prefill", "")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"model": SMALL, "models": [{"model": LARGE}]}, "either model"),
        ({}, "either model"),
        ({**two_models(), "decode": {"num_replicas": 1}}, "move decode into its models[i]"),
        (
            {"models": [{"model": SMALL}, {"model": {**LARGE, "served_name": "small"}}]},
            "models[1].model.served_name",
        ),
        (
            {"models": [{"model": SMALL}, {"model": LARGE, "decode": {"num_replicas": 0}}]},
            "models[1].decode needs at least one replica",
        ),
        (
            {
                "models": [
                    {"model": SMALL},
                    {"model": LARGE, "prefill": {"engine": {"block_size": 32}}},
                ]
            },
            "models[1].prefill.engine.block_size",
        ),
    ],
)
def test_bad_model_lists_are_refused_naming_the_field(data: dict[str, Any], field: str) -> None:
    assert field in refused(data)


def test_aliases_are_served_only_when_unambiguous() -> None:
    config = ClusterConfig.model_validate(
        {"models": [{"model": SMALL}, {"model": {**SMALL, "served_name": "small-b"}}]}
    )
    names = served_names(config.served_models())
    assert set(names) == {"small", "small-b"}  # builtin:tiny-llama names both: not an alias


def virtual(**fields: Any) -> dict[str, Any]:
    return two_models(virtual_models=[{"name": "auto", "default": "small", **fields}])


def test_a_virtual_model_routes_to_served_models() -> None:
    rules = [{"model": "large", "min_prompt_tokens": 100}]
    config = ClusterConfig.model_validate(
        virtual(rules=rules, cascade={"escalate_to": "large", "min_mean_logprob": -2.0})
    )
    (auto,) = config.virtual_models
    assert auto.models() == [
        ("default", "small"),
        ("rules[0].model", "large"),
        ("cascade.escalate_to", "large"),
    ]
    assert auto.rules[0].reason == "prompt_tokens"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"default": "huge"}, "virtual_models[0].default: no served model is named 'huge'"),
        (
            {"rules": [{"model": "huge", "header": "x-tier"}]},
            "virtual_models[0].rules[0].model: no served model is named 'huge'",
        ),
        (
            {"cascade": {"escalate_to": "huge"}},
            "virtual_models[0].cascade.escalate_to: no served model",
        ),
        ({"name": "small"}, "virtual_models[0].name: 'small' is already a served model name"),
        ({"cascade": {"escalate_to": "small"}}, "escalate to another"),
        ({"rules": [{"model": "large"}]}, "at least one condition"),
        ({"rules": [{"model": "large", "header_value": "hard"}]}, "header_value needs header"),
        ({"rules": [{"model": "large", "message_regex": "(unclosed"}]}, "invalid regular"),
        (
            {"rules": [{"model": "large", "min_prompt_tokens": 9, "max_prompt_tokens": 3}]},
            "never matches",
        ),
        (
            {"rules": [{"model": "large", "name": "default", "header": "x"}]},
            "pdserve itself reports",
        ),
    ],
)
def test_bad_virtual_models_are_refused(fields: dict[str, Any], message: str) -> None:
    assert message in refused(virtual(**fields))


def test_the_planner_sizes_one_model_only() -> None:
    scaled = {"autoscaling": {"min_replicas": 1, "max_replicas": 2}}
    data = {
        "models": [
            {"model": SMALL, "prefill": scaled, "decode": scaled},
            {"model": LARGE, "prefill": scaled, "decode": scaled},
        ],
        "planner": {"mode": "load"},
    }
    assert "with several models use mode off" in refused(data)
