"""Fixtures of the GPU tests: HF transformers models of the built-ins on CUDA, loaded once.

Every module here carries the ``gpu`` marker and skips without CUDA; nothing in this file
touches the device at import time, so collecting ``tests/`` on a CPU machine stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.builtin import resolve_model
from tests.gpu.helpers import DEVICE


@pytest.fixture(scope="session")
def hf_cuda() -> Callable[[str, torch.dtype], torch.nn.Module]:
    """``hf_cuda(builtin_name, dtype)``: the HF transformers model of a built-in on CUDA."""
    cache: dict[tuple[str, torch.dtype], torch.nn.Module] = {}

    def get(name: str, dtype: torch.dtype) -> torch.nn.Module:
        if (name, dtype) not in cache:
            from transformers import AutoModelForCausalLM

            path: Path = resolve_model(name)
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
            cache[(name, dtype)] = model.to(DEVICE).eval()
        return cache[(name, dtype)]

    return get
