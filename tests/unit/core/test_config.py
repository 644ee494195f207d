"""The config schema rejects unknown keys and bad values with field-level messages."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import EngineConfig, ModelConfig


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
