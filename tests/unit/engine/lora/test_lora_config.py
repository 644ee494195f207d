"""The engine's LoRA options: vLLM's names, validated where they are declared."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import EngineConfig
from core.config.engine import LORA_RANKS


def test_defaults_serve_no_adapters() -> None:
    config = EngineConfig()
    assert (config.enable_lora, config.max_loras, config.max_lora_rank) == (False, 1, 16)
    assert config.max_cpu_loras is None and config.num_cpu_loras == 1
    assert EngineConfig(max_loras=4).num_cpu_loras == 4
    assert EngineConfig(max_loras=4, max_cpu_loras=9).num_cpu_loras == 9


@pytest.mark.parametrize("rank", LORA_RANKS)
def test_every_allowed_rank(rank: int) -> None:
    assert EngineConfig(enable_lora=True, max_lora_rank=rank).max_lora_rank == rank


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_lora_rank": 12}, r"max_lora_rank \(12\) must be one of"),
        ({"max_loras": 4, "max_cpu_loras": 2}, r"max_cpu_loras \(2\) must be >= max_loras \(4\)"),
        ({"max_loras": 0}, "max_loras"),
        ({"enable_lora": True, "tensor_parallel_size": 2}, "tensor_parallel_size > 1"),
        ({"enable_lora": True, "compile_model": True}, "compile_model"),
        ({"enable_loras": True}, "enable_loras"),
    ],
)
def test_refused(options: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        EngineConfig(**options)  # type: ignore[arg-type]
