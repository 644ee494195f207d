"""Fixtures for the ingress tests: the built-in byte tokenizer and ``make_harness``, an app
over the scripted fake pool clients of ``fakes.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.ingress import create_app
from cluster.ingress.model_table import ModelEndpoint
from engine.builtin.specs import BUILTIN_SPECS
from engine.builtin.writer import write_tokenizer_files
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import FakeDecode, FakePrefill, Harness, settings_with


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory: Path = tmp_path_factory.mktemp("tiny-llama-tokenizer")
    write_tokenizer_files(BUILTIN_SPECS["tiny-llama"], directory)
    return Tokenizer.from_dir(directory)


@pytest.fixture
def make_harness(tokenizer: Tokenizer) -> Callable[..., Harness]:
    def make(
        prefill: FakePrefill | None = None,
        decode: FakeDecode | None = None,
        stats_provider: Any = None,
        cached_blocks_fn: Any = None,
        **settings: Any,
    ) -> Harness:
        prefill = prefill or FakePrefill()
        decode = decode or FakeDecode()
        endpoint = ModelEndpoint(
            tokenizer, prefill, decode, settings_with(**settings), cached_blocks_fn
        )
        app = create_app([endpoint], stats_provider=stats_provider)
        return Harness(app, prefill, decode)

    return make
