"""The engine's CUDA-graph options: defaults and validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import EngineConfig


def test_defaults_leave_the_choice_to_the_device() -> None:
    cfg = EngineConfig()
    assert cfg.enforce_eager is False
    assert cfg.cuda_graph_batch_sizes is None  # the engine derives them from max_num_seqs
    for name in ("enforce_eager", "cuda_graph_batch_sizes"):
        assert EngineConfig.model_fields[name].description


def test_batch_sizes_from_yaml_lists() -> None:
    cfg = EngineConfig.model_validate({"max_num_seqs": 32, "cuda_graph_batch_sizes": [1, 8, 32]})
    assert cfg.cuda_graph_batch_sizes == (1, 8, 32)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([], "must not be empty"),
        ([0, 4], r"1\.\.max_num_seqs \(64\)"),
        ([1, 128], r"1\.\.max_num_seqs \(64\)"),
        ([8, 4], "strictly increasing"),
        ([4, 4], "strictly increasing"),
    ],
)
def test_bad_batch_sizes_name_the_field(sizes: list[int], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as err:
        EngineConfig.model_validate({"cuda_graph_batch_sizes": sizes})
    assert "cuda_graph_batch_sizes" in str(err.value)
