"""Fields applied in place: the Ingress ``user_config`` carries exactly them, overlaying it on
the deployed config changes only them, anything else in it is refused naming it; the ASGI app
the ingress mounts forwards to whichever app is current."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cluster.ops.deploy_schema import configured_schema
from cluster.serve.config_file import load_cluster_config
from cluster.serve.in_place import (
    IN_PLACE_FIELDS,
    applies_in_place,
    in_place_user_config,
    with_in_place,
)
from cluster.serve.swappable_asgi import SwappableAsgi
from core.errors import ConfigError

pytestmark = pytest.mark.timeout(10)

BASE: dict[str, Any] = {
    "models": [
        {"model": {"name": "builtin:tiny-llama", "served_name": "small"}},
        {"model": {"name": "builtin:tiny-moe", "served_name": "big"}},
    ],
    "routing": {"policy": "least_loaded", "kv_index_shards": 2},
}
VIRTUAL = [{"name": "auto", "default": "small"}]


def test_the_user_config_carries_only_the_in_place_fields() -> None:
    config = load_cluster_config(
        {
            **BASE,
            "routing": {"migration_limit": 5, "policy": "hot_prefix"},
            "planner": {"max_step": 4},
            "virtual_models": VIRTUAL,
        }
    )
    user_config = in_place_user_config(config)
    assert tuple(user_config) == IN_PLACE_FIELDS
    assert user_config["routing.migration_limit"] == 5
    assert user_config["routing.policy"] == "hot_prefix"
    assert user_config["planner"]["max_step"] == 4
    assert [v["name"] for v in user_config["virtual_models"]] == ["auto"]


def test_overlaying_changes_the_in_place_fields_and_keeps_the_rest() -> None:
    base = load_cluster_config(BASE)
    new = load_cluster_config(
        {
            **BASE,
            "routing": {**BASE["routing"], "migration_limit": 0, "policy": "round_robin"},
            "disaggregation": {"local_prefill_threshold_tokens": 64},
            "planner": {"decode_kv_usage_target": 0.5},
            "virtual_models": VIRTUAL,
        }
    )
    applied = with_in_place(base, in_place_user_config(new))
    assert applied == new
    assert applied.routing.policy == "round_robin" and applied.routing.kv_index_shards == 2
    assert with_in_place(base, None) is base and with_in_place(base, {}) is base


def test_a_user_config_setting_another_field_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"got routing\.kv_index_shards") as info:
        with_in_place(load_cluster_config(BASE), {"routing.kv_index_shards": 4})
    assert info.value.param == "user_config.routing.kv_index_shards"


def test_a_user_config_changing_the_planner_profile_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"may not change planner\.profile") as info:
        with_in_place(load_cluster_config(BASE), {"planner": {"profile": "capacity.json"}})
    assert info.value.param == "user_config.planner.profile"


def test_routing_knobs_and_planner_thresholds_apply_in_place_index_layout_does_not() -> None:
    assert applies_in_place("routing.policy") and applies_in_place("routing.hot_prefixes")
    assert applies_in_place("planner.max_step") and applies_in_place("disaggregation")
    for pinned in ("planner.mode", "planner.profile", "routing.kv_index_shards"):
        assert not applies_in_place(pinned)
    assert not applies_in_place("routing.kv_index_stride")
    assert not applies_in_place("routing.policy_extra")  # a prefix of a name is not the field


def test_the_configured_schema_sets_user_config_and_keeps_other_overrides() -> None:
    current: dict[str, Any] = {
        "applications": [
            {"name": "other", "import_path": "x:y"},
            {"name": "pdserve", "deployments": [{"name": "Decode", "num_replicas": 3}]},
        ]
    }
    schema = configured_schema(current, "pdserve", "Ingress", {"routing.migration_limit": 1})
    assert schema["applications"][0] == {"name": "other", "import_path": "x:y"}
    assert schema["applications"][1]["deployments"] == [
        {"name": "Decode", "num_replicas": 3},
        {"name": "Ingress", "user_config": {"routing.migration_limit": 1}},
    ]
    assert current["applications"][1]["deployments"] == [{"name": "Decode", "num_replicas": 3}]
    with pytest.raises(ConfigError, match="no application 'gone'"):
        configured_schema(current, "gone", "Ingress", {})


def test_the_swappable_app_forwards_to_the_current_one() -> None:
    seen: list[str] = []

    def app(name: str) -> Any:
        async def call(scope: Any, receive: Any, send: Any) -> None:
            seen.append(f"{name}:{scope['path']}")

        return call

    asgi = SwappableAsgi(app("old"))
    asgi_call = asgi({"path": "/a"}, None, None)  # type: ignore[arg-type]
    asyncio.run(asgi_call)
    asgi.swap(app("new"))
    asyncio.run(asgi({"path": "/b"}, None, None))  # type: ignore[arg-type]
    assert seen == ["old:/a", "new:/b"]
