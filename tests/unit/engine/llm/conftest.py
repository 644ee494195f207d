"""Fixtures for the offline-API tests: HF checkpoints saved once per session, built-in models."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from engine.builtin.byte_tokenizer import byte_to_char_map
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint, save_checkpoint


def add_byte_tokenizer(directory: Path) -> None:
    """Give a transformers-saved test checkpoint (vocab 256) a plain byte-level tokenizer."""
    vocab = {char: byte for byte, char in byte_to_char_map().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({}))


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
