"""Turn a model name or path into a local checkpoint directory.

``builtin:<name>`` random-weight checkpoints are written on first use into
``cache_dir()/models/<name>``; a packaged built-in (``builtin:smollm2-135m-instruct``) and any
``.gguf`` path resolve to the GGUF file's metadata directory (``engine.gguf.sidecar``), written
on first use — into ``cache_dir()/models/<name>`` for a built-in, ``cache_dir()/gguf/`` for a
path — and rewritten when the file changes. Every directory is written atomically
(``engine.atomic_dir``). Writing a GGUF file's directory checks the file, so a bad one is
refused here, in one line, before any engine is built.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from core.builtin_models import BUILTIN_PREFIX, builtin_name, models_dir
from core.env import cache_dir
from core.errors import ModelNotFoundError
from engine.atomic_dir import ensure_dir
from engine.builtin.packaged import PACKAGED_MODELS, packaged_file
from engine.builtin.specs import BUILTIN_SPECS, BuiltinSpec
from engine.builtin.writer import MARKER_FILE, marker, write_checkpoint
from engine.gguf import is_current, is_gguf_path, write_sidecar

GGUF_DIRS = "gguf"


def builtin_model_names() -> tuple[str, ...]:
    """The names accepted as ``model``, e.g. ``("builtin:tiny-llama", "builtin:tiny-moe", ...)``."""
    return tuple(BUILTIN_PREFIX + name for name in [*BUILTIN_SPECS, *PACKAGED_MODELS])


def resolve_model(name_or_path: str) -> Path:
    """The checkpoint directory for ``name_or_path`` (writing a built-in or a GGUF file's
    metadata directory on first use).

    Raises :class:`ModelNotFoundError` (``param="model"``) for an unknown built-in name, listing
    the built-ins, for a missing packaged model's package, or for a path that is neither a
    directory nor a ``.gguf`` file; a bad GGUF file raises the error that names its defect.
    """
    name = builtin_name(name_or_path)
    if name is not None:
        if name in PACKAGED_MODELS:
            return ensure_gguf_dir(packaged_file(PACKAGED_MODELS[name]), models_dir() / name)
        spec = BUILTIN_SPECS.get(name)
        if spec is None:
            known = ", ".join(builtin_model_names())
            raise ModelNotFoundError(
                f"unknown built-in model {name_or_path!r}; built-ins are: {known}", param="model"
            )
        return ensure_builtin(spec, models_dir())
    path = Path(name_or_path).expanduser()
    if is_gguf_path(path) and path.is_file():
        return ensure_gguf_dir(path, gguf_dir_for(path))
    if not path.is_dir():
        raise ModelNotFoundError(
            f"model {name_or_path!r} is neither a built-in ({', '.join(builtin_model_names())}) "
            "nor an existing directory or .gguf file",
            param="model",
        )
    return path


def ensure_builtin(spec: BuiltinSpec, models_dir: Path) -> Path:
    """``models_dir/<spec.name>``, written there atomically unless a current copy exists."""
    return ensure_dir(
        models_dir / spec.name,
        lambda target: _is_current(target, spec),
        lambda staging: write_checkpoint(spec, staging),
    )


def ensure_gguf_dir(gguf_path: Path, target: Path) -> Path:
    """``target`` holding ``gguf_path``'s metadata files, unless a current copy exists."""
    return ensure_dir(
        target,
        lambda directory: is_current(directory, gguf_path),
        lambda staging: write_sidecar(gguf_path, staging),
    )


def gguf_dir_for(gguf_path: Path) -> Path:
    """Where the metadata directory of the GGUF file at ``gguf_path`` is cached."""
    resolved = str(gguf_path.expanduser().resolve())
    digest = hashlib.blake2b(resolved.encode(), digest_size=6).hexdigest()
    return cache_dir() / GGUF_DIRS / f"{gguf_path.stem}-{digest}"


def _is_current(target: Path, spec: BuiltinSpec) -> bool:
    try:
        found = json.loads((target / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(found == marker(spec))
