"""Fixtures for the model-family tests: one saved checkpoint per preset per session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.engine.models.hf_checkpoints import HFCheckpoint, save_checkpoint


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], HFCheckpoint]:
    """``hf_checkpoint(preset)``: the preset saved once per session (hub layout, one file)."""
    cache: dict[str, HFCheckpoint] = {}

    def get(preset: str) -> HFCheckpoint:
        if preset not in cache:
            cache[preset] = save_checkpoint(preset, tmp_path_factory.mktemp(preset))
        return cache[preset]

    return get
