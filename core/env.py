"""The one place pdserve reads environment variables. None of them changes the deployment graph."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_dir() -> Path:
    """Where built-in model checkpoints are written (``PDSERVE_CACHE_DIR``)."""
    default = Path.home() / ".cache" / "pdserve"
    return Path(os.environ.get("PDSERVE_CACHE_DIR", str(default))).expanduser()


def triton_interpret() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def num_threads() -> int | None:
    """Torch intra-op threads override (``PDSERVE_NUM_THREADS``); None keeps torch's default."""
    value = os.environ.get("PDSERVE_NUM_THREADS")
    return int(value) if value else None


def secret_from_env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A secret (API key, KV transfer token) from the variable ``name`` that a config names."""
    return (environ if environ is not None else os.environ).get(name)
