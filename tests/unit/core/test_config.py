"""The config schema rejects unknown keys and bad values with field-level messages."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import ClusterConfig, EngineConfig, ModelConfig


def test_unknown_keys_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        EngineConfig.model_validate({"block_size": 16, "blok_size": 8})
    assert "blok_size" in str(info.value)


def test_cross_field_validation_names_fields() -> None:
    with pytest.raises(ValidationError) as info:
        EngineConfig(block_size=64, max_num_batched_tokens=32)
    assert "max_num_batched_tokens" in str(info.value)
    with pytest.raises(ValidationError):
        ModelConfig.model_validate({"name": "builtin:tiny-moe", "dtype": "float64"})


def test_every_field_is_described() -> None:
    for model in (EngineConfig, ModelConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


@pytest.mark.parametrize(
    ("key", "prefill_value", "decode_value"),
    [("hash_seed", 1, 2), ("block_size", 16, 32)],
)
def test_prefill_and_decode_that_disagree_on_the_kv_contract_are_refused(
    key: str, prefill_value: int, decode_value: int
) -> None:
    data = {
        "model": {"name": "builtin:tiny-llama"},
        "prefill": {"engine": {key: prefill_value}},
        "decode": {"engine": {key: decode_value}},
    }
    with pytest.raises(ValidationError, match=rf"prefill\.engine\.{key} .* must equal"):
        ClusterConfig.model_validate(data)
    data["decode"] = {"engine": {key: prefill_value}}
    assert (
        ClusterConfig.model_validate(data).engine_for("decode").model_dump()[key] == prefill_value
    )


def test_hash_seed_has_one_owner_the_engine_config() -> None:
    config = ClusterConfig.model_validate(
        {"model": {"name": "builtin:tiny-llama"}, "engine": {"hash_seed": 7}}
    )
    assert config.engine_for("prefill").hash_seed == config.engine_for("decode").hash_seed == 7
