"""The apps the ingress follows per served model (``FOLLOW_KEY`` of its ``user_config``): a
list per model, oldest version first; the older one-app shape reads as the running app's pools
beside that app; anything else is a typed error naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.serve.rollout_pools import FOLLOW_KEY, followed_apps, split_user_config
from core.errors import ConfigError

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("value", "followed"),
    [
        (None, {}),
        ({}, {}),
        ({"llama": ["pdserve-rollout"]}, {"llama": ["pdserve-rollout"]}),
        ({"llama": ["pdserve-rollout", "pdserve-rollout-2"], "qwen": ["pdserve"]},
         {"llama": ["pdserve-rollout", "pdserve-rollout-2"], "qwen": ["pdserve"]}),
        ({"llama": ("a", "b", "a")}, {"llama": ["a", "b"]}),
        ({"llama": "pdserve-rollout"}, {"llama": ["pdserve", "pdserve-rollout"]}),
        ({"llama": "pdserve"}, {"llama": ["pdserve"]}),
    ],
)  # fmt: skip
def test_each_model_follows_a_list_of_apps(value: Any, followed: dict[str, list[str]]) -> None:
    assert followed_apps(value, "pdserve") == followed


@pytest.mark.parametrize(
    "value",
    [
        ["pdserve-rollout"],
        "pdserve-rollout",
        {"llama": []},
        {"llama": [""]},
        {"llama": ["pdserve-rollout", 3]},
        {"llama": None},
        {3: ["pdserve-rollout"]},
        {"llama": {"app": "pdserve-rollout"}},
    ],
)
def test_any_other_shape_is_a_typed_error(value: Any) -> None:
    with pytest.raises(ConfigError, match="lists of app names") as info:
        followed_apps(value, "pdserve")
    assert info.value.param == f"user_config.{FOLLOW_KEY}"


def test_the_in_place_fields_are_kept_apart() -> None:
    user_config = {"routing.migration_limit": 1, FOLLOW_KEY: {"llama": "pdserve-rollout"}}
    fields, followed = split_user_config(user_config, "pdserve")
    assert fields == {"routing.migration_limit": 1}
    assert followed == {"llama": ["pdserve", "pdserve-rollout"]}
    assert FOLLOW_KEY in user_config  # the caller's mapping is not changed
