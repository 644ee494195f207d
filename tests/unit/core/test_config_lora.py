"""``model.lora_modules``: parsed under the model both pools share, refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.config import ClusterConfig

MODEL = {"name": "builtin:tiny-llama", "served_name": "base"}


def cluster(modules: list[dict[str, Any]], **engine: Any) -> dict[str, Any]:
    return {
        "model": {**MODEL, "lora_modules": modules},
        "engine": {"enable_lora": True, "max_loras": 2, **engine},
    }


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        ClusterConfig.model_validate(data)
    return str(info.value)


def test_modules_are_read_in_order_for_both_pools() -> None:
    config = ClusterConfig.model_validate(
        cluster([{"name": "sql", "path": "/a/sql"}, {"name": "chat", "path": "/a/chat"}])
    )
    (served,) = config.served_models()
    assert [m.name for m in served.model.lora_modules] == ["sql", "chat"]
    assert served.model.lora_modules[0].path == "/a/sql"
    assert served.engine_for("prefill").enable_lora and served.engine_for("decode").enable_lora


def test_unknown_keys_and_bad_names_are_refused() -> None:
    assert "extra" in refused(cluster([{"name": "a", "path": "/p", "rank": 8}])).lower()
    assert "lora_modules.0.name" in refused(cluster([{"name": "a/b", "path": "/p"}]))
    assert "lora_modules.0.path" in refused(cluster([{"name": "a"}]))


def test_duplicate_names_a_foreign_base_and_lora_off_are_refused() -> None:
    twice = [{"name": "a", "path": "/p"}, {"name": "a", "path": "/q"}]
    assert "model.lora_modules[1].name: 'a' is listed twice" in refused(cluster(twice))
    foreign = [{"name": "a", "path": "/p", "base_model_name": "other"}]
    assert "lora_modules[0].base_model_name: 'other' is not the served model 'base'" in refused(
        cluster(foreign)
    )
    off = cluster([{"name": "a", "path": "/p"}], enable_lora=False)
    assert "model.lora_modules needs engine.enable_lora: true" in refused(off)


def test_pools_must_agree_on_enable_lora() -> None:
    data = cluster([], enable_lora=False)
    data["decode"] = {"engine": {"enable_lora": True}}
    data["prefill"] = {"num_replicas": 1}
    assert "prefill.engine.enable_lora (False) must equal decode.engine.enable_lora" in refused(
        data
    )
