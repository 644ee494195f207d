"""The ``engine.speculative`` section: vLLM's field names, bad blocks refused in one line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import EngineConfig, SpeculativeConfig
from core.config.files import validate_mapping
from core.errors import ConfigError


def _spec(**fields: object) -> SpeculativeConfig:
    return validate_mapping(SpeculativeConfig, fields, kind="speculative_config", source="test")


def test_off_by_default_and_vllm_shaped_block_accepted() -> None:
    assert EngineConfig().speculative is None
    cfg = EngineConfig.model_validate(
        {"speculative": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}}
    )
    assert cfg.speculative is not None
    assert cfg.speculative.num_speculative_tokens == 4
    assert cfg.speculative.prompt_lookup_max == 3


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"method": "ngram"}, "num_speculative_tokens: Field required"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method: Input should be"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "lookahead: Extra"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens: Input"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 3,
            },
            "prompt_lookup_min (4) must be <= prompt_lookup_max (3)",
        ),
        (
            {"method": "draft_model", "num_speculative_tokens": 2},
            "method 'draft_model' needs model",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "only read by method"),
    ],
)
def test_bad_blocks_refused_in_one_line(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        _spec(**fields)
    message = str(info.value)
    assert named in message
    assert "\n" not in message


def test_overlap_on_is_refused_with_speculation() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ValidationError, match="async_scheduling 'on' cannot be combined"):
        EngineConfig.model_validate({"speculative": spec, "async_scheduling": "on"})
    assert EngineConfig.model_validate({"speculative": spec, "async_scheduling": "auto"})


def test_tensor_parallel_is_refused_with_speculation() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ValidationError, match="cannot be combined with speculative decoding"):
        EngineConfig.model_validate({"speculative": spec, "tensor_parallel_size": 2})
