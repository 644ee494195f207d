"""routing:, disaggregation: and planner: are sections of their own; a config still using the old
scheduler: section is refused with the new key of each old one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.serve.config_file import load_cluster_config
from core.config import ClusterConfig
from core.errors import ConfigError

MODEL = {"name": "builtin:tiny-llama"}


def test_sections_read_their_own_keys() -> None:
    config = ClusterConfig.model_validate(
        {
            "model": MODEL,
            "routing": {"policy": "least_loaded", "migration_limit": 1},
            "disaggregation": {"local_prefill_threshold_tokens": 7},
            "planner": {"mode": "off"},
        }
    )
    assert config.routing.policy == "least_loaded"
    assert config.routing.migration_limit == 1
    assert config.disaggregation.local_prefill_threshold_tokens == 7
    assert config.disaggregation.fallback_to_local_prefill is True
    assert config.planner.mode == "off"


@pytest.mark.parametrize(
    ("old", "param", "new"),
    [
        ({"policy": "round_robin"}, "scheduler.policy", "routing.policy"),
        ({"migration_limit": 0}, "scheduler.migration_limit", "routing.migration_limit"),
        (
            {"local_prefill_threshold_tokens": 8},
            "scheduler.local_prefill_threshold_tokens",
            "disaggregation.local_prefill_threshold_tokens",
        ),
        ({"planner": {"mode": "load"}}, "scheduler.planner", "-> planner"),
    ],
)
def test_old_scheduler_keys_name_their_new_home(old: dict, param: str, new: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClusterConfig.model_validate({"model": MODEL, "scheduler": old})
    assert info.value.param == param
    assert new in info.value.message
    assert "routing:, disaggregation: and planner:" in info.value.message


def test_an_empty_old_section_lists_every_move() -> None:
    with pytest.raises(ConfigError) as info:
        ClusterConfig.model_validate({"model": MODEL, "scheduler": {}})
    assert info.value.param == "scheduler"
    assert "scheduler.policy -> routing.policy" in info.value.message
    assert "scheduler.planner -> planner" in info.value.message


def test_an_old_yaml_file_fails_at_load(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("model: {name: builtin:tiny-llama}\nscheduler:\n  policy: prefix_aware\n")
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    assert "scheduler.policy -> routing.policy" in info.value.message
