"""Fixtures for the offline-API tests: HF checkpoints saved once per session, built-in models."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.engine.models.hf_checkpoints import (
    HFCheckpoint,
    add_byte_tokenizer,
    save_checkpoint,
)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], HFCheckpoint]:
    """``checkpoint(preset)``: a transformers-built checkpoint saved once per session."""
    cache: dict[str, HFCheckpoint] = {}

    def get(preset: str) -> HFCheckpoint:
        if preset not in cache:
            saved = save_checkpoint(preset, tmp_path_factory.mktemp(f"llm-{preset}"))
            add_byte_tokenizer(saved.path)
            cache[preset] = saved
        return cache[preset]

    return get
