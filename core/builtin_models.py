"""The names of pdserve's built-in models (``builtin:<name>``) and where each is cached.

The engine writes a built-in checkpoint into :func:`builtin_dir` on first use; the load tester
and the sizer read its ``tokenizer.json`` and ``config.json`` from there without importing the
engine. Which names exist is the engine's (``engine.builtin``).
"""

from __future__ import annotations

from pathlib import Path

from core.env import cache_dir

BUILTIN_PREFIX = "builtin:"


def builtin_name(model: str) -> str | None:
    """``tiny-llama`` for ``builtin:tiny-llama``; None when ``model`` is no built-in name."""
    return model.removeprefix(BUILTIN_PREFIX) if model.startswith(BUILTIN_PREFIX) else None


def models_dir() -> Path:
    """The directory built-in checkpoints are written into (under ``PDSERVE_CACHE_DIR``)."""
    return cache_dir() / "models"


def builtin_dir(model: str) -> Path:
    """Where the built-in ``model`` (``builtin:NAME`` or ``NAME``) is cached once written."""
    return models_dir() / model.removeprefix(BUILTIN_PREFIX)
