"""Router settings from request_router_kwargs, and the Serve config the app builder gets."""

from __future__ import annotations

import json

import pytest

from cluster.routing.hit_minus_load import HotPrefixPolicy
from cluster.routing.policy_types import CostWeights, HotSpotConfig, PoolRole
from cluster.routing.pool_router_config import request_router_config
from cluster.routing.router_kwargs import RouterSettings
from cluster.routing.serve_router import (
    HotPrefixRequestRouter,
    LeastLoadedRequestRouter,
    PdserveRequestRouter,
    PrefixAwareRequestRouter,
    RoundRobinRequestRouter,
)
from core.config import HotPrefixConfig
from core.errors import ConfigError


def test_settings_round_trip_through_json_kwargs() -> None:
    settings = RouterSettings.from_kwargs(
        {"pool": "decode", "policy": "least_loaded", "weights": {"request": 3.0}, "block_size": 8}
    )
    assert settings.pool is PoolRole.DECODE
    assert settings.weights == CostWeights(request=3.0)
    assert settings.hot_spot == HotSpotConfig()
    kwargs = json.loads(json.dumps(settings.to_kwargs()))
    assert RouterSettings.from_kwargs(kwargs) == settings


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"pool": "both"}, "request_router_kwargs.pool"),
        ({"pool": "prefill", "colour": 1, "block_size": 16}, "request_router_kwargs.colour"),
        ({"pool": "prefill", "policy": "random", "block_size": 16}, "routing.policy"),
        (
            {"pool": "prefill", "weights": {"bogus": 1}, "block_size": 16},
            "request_router_kwargs.weights",
        ),
        ({"pool": "prefill", "hot_spot": 3, "block_size": 16}, "request_router_kwargs.hot_spot"),
        ({"pool": "prefill", "block_size": 0}, "request_router_kwargs.block_size"),
        (
            {"pool": "decode", "hot_prefixes": {"ttft_target_s": 0}, "block_size": 16},
            "request_router_kwargs.hot_prefixes",
        ),
        ({"pool": "prefill"}, "request_router_kwargs.block_size"),
        (
            {"pool": "prefill", "poll_interval_s": 0, "block_size": 16},
            "request_router_kwargs.poll_interval_s",
        ),
    ],
)
def test_bad_settings_name_the_key(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(ConfigError) as info:
        RouterSettings.from_kwargs(kwargs)
    assert info.value.param == param


@pytest.mark.parametrize(
    ("policy", "router_class"),
    [
        ("prefix_aware", PrefixAwareRequestRouter),
        ("least_loaded", LeastLoadedRequestRouter),
        ("round_robin", RoundRobinRequestRouter),
        ("hot_prefix", HotPrefixRequestRouter),
    ],
)
def test_request_router_config_per_yaml_policy(
    policy: str, router_class: type[PdserveRequestRouter]
) -> None:
    config = request_router_config(
        "prefill", policy, block_size=16, options={"session_ttl_s": 60.0}
    )
    assert config.get_request_router_class() is router_class
    kwargs = config.request_router_kwargs
    json.dumps(kwargs)  # Serve requires JSON-serialisable kwargs
    settings = RouterSettings.from_kwargs(kwargs)
    assert (settings.pool, settings.policy, settings.block_size) == (PoolRole.PREFILL, policy, 16)
    assert settings.session_ttl_s == 60.0
    assert config.request_routing_stats_period_s == 1.0


def test_request_router_config_rejects_unknown_policies() -> None:
    with pytest.raises(ConfigError):
        request_router_config("decode", "fastest", block_size=16)


def test_hot_prefix_settings_reach_the_policy_through_json_kwargs() -> None:
    config = request_router_config(
        "decode",
        "hot_prefix",
        block_size=16,
        options={"hot_prefixes": {"ttft_target_s": 0.25, "max_copies_per_prefix": 3}},
    )
    settings = RouterSettings.from_kwargs(json.loads(json.dumps(config.request_router_kwargs)))
    expected = HotPrefixConfig(ttft_target_s=0.25, max_copies_per_prefix=3)
    assert settings.hot_prefixes == expected
    assert settings.make_policy() == HotPrefixPolicy(expected)
