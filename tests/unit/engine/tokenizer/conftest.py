"""Fixtures: the built-in byte-level tokenizer's files, written once into a temporary dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.builtin.specs import BUILTIN_SPECS
from engine.builtin.writer import write_tokenizer_files
from engine.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama-tokenizer")
    write_tokenizer_files(BUILTIN_SPECS["tiny-llama"], directory)
    return directory


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)
