"""Fixtures for the AsyncEngine tests: the offline ``LLM`` whose engine they wrap, and its greedy
reference outputs (computed first, so the engine is idle when a test wraps it)."""

from __future__ import annotations

import pytest

from engine.llm import LLM
from tests.unit.engine.async_engine.tiny_engine import greedy_reference, new_offline_llm


@pytest.fixture(scope="session")
def offline_llm() -> LLM:
    """The offline API on its own engine: the engine of the AsyncEngine tests."""
    return new_offline_llm()


@pytest.fixture(scope="session")
def reference(offline_llm: LLM) -> dict[str, list[int]]:
    """Greedy token ids of every prompt from the offline ``LLM``."""
    return greedy_reference(offline_llm)
