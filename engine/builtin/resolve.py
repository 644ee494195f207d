"""Turn a model name or path into a local HF-layout checkpoint directory.

``builtin:<name>`` checkpoints are written on first use into ``cache_dir()/models/<name>``:
into a private temporary directory next to it, then renamed into place, so a reader never sees a
half-written checkpoint and processes racing to write the same one are safe (the loser of the
rename discards its copy). A cached copy from an older format version is replaced the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

from core.builtin_models import BUILTIN_PREFIX, builtin_name, models_dir
from core.errors import ConfigError, ModelNotFoundError
from engine.builtin.specs import BUILTIN_SPECS, BuiltinSpec
from engine.builtin.writer import MARKER_FILE, marker, write_checkpoint

logger = logging.getLogger(__name__)


def builtin_model_names() -> tuple[str, ...]:
    """The names accepted as ``model``, e.g. ``("builtin:tiny-llama", "builtin:tiny-moe")``."""
    return tuple(BUILTIN_PREFIX + name for name in BUILTIN_SPECS)


def resolve_model(name_or_path: str) -> Path:
    """The checkpoint directory for ``name_or_path`` (writing a built-in on first use).

    Raises :class:`ModelNotFoundError` (``param="model"``) for an unknown built-in name, listing
    the built-ins, or for a path that is not a directory.
    """
    name = builtin_name(name_or_path)
    if name is not None:
        spec = BUILTIN_SPECS.get(name)
        if spec is None:
            known = ", ".join(builtin_model_names())
            raise ModelNotFoundError(
                f"unknown built-in model {name_or_path!r}; built-ins are: {known}", param="model"
            )
        return ensure_builtin(spec, models_dir())
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(
            f"model {name_or_path!r} is neither a built-in ({', '.join(builtin_model_names())}) "
            "nor an existing directory",
            param="model",
        )
    return path


def ensure_builtin(spec: BuiltinSpec, models_dir: Path) -> Path:
    """``models_dir/<spec.name>``, written there atomically unless a current copy exists."""
    target = models_dir / spec.name
    if _is_current(target, spec):
        return target
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=models_dir))
        try:
            write_checkpoint(spec, staging)
            _install(staging, target, spec)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        raise ConfigError(
            f"cannot write built-in model {spec.name!r} into {str(models_dir)!r} ({e}); "
            "set PDSERVE_CACHE_DIR to a writable directory",
            param="PDSERVE_CACHE_DIR",
        ) from e
    return target


def _install(staging: Path, target: Path, spec: BuiltinSpec) -> None:
    """Rename ``staging`` to ``target``; a current copy already there (a racer won) is kept."""
    if target.exists() and not _is_current(target, spec):
        stale = Path(tempfile.mkdtemp(prefix=f".{spec.name}.stale-", dir=target.parent))
        with contextlib.suppress(OSError):  # another process may have moved it first
            target.rename(stale / spec.name)
            logger.info("replaced built-in checkpoint %s of an older format", target)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        staging.rename(target)
        logger.info("wrote built-in checkpoint %s", target)
    except OSError:
        if not _is_current(target, spec):
            raise


def _is_current(target: Path, spec: BuiltinSpec) -> bool:
    try:
        found = json.loads((target / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(found == marker(spec))
