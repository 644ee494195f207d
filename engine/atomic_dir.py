"""Write a cached directory once, atomically: a reader never sees it half-written.

The files go into a private temporary directory next to the target, which is then renamed into
place, so processes racing to write the same directory are safe (the loser of the rename
discards its copy). A copy that is no longer current (an older format, a changed source) is
moved aside and replaced the same way.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from core.errors import ConfigError

logger = logging.getLogger(__name__)


def ensure_dir(
    target: Path, is_current: Callable[[Path], bool], write: Callable[[Path], None]
) -> Path:
    """``target``, written by ``write(staging_dir)`` unless ``is_current(target)``."""
    if is_current(target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            write(staging)
            _install(staging, target, is_current)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        raise ConfigError(
            f"cannot write {target.name!r} into {str(target.parent)!r} ({e}); "
            "set PDSERVE_CACHE_DIR to a writable directory",
            param="PDSERVE_CACHE_DIR",
        ) from e
    return target


def _install(staging: Path, target: Path, is_current: Callable[[Path], bool]) -> None:
    """Rename ``staging`` to ``target``; a current copy already there (a racer won) is kept."""
    if target.exists() and not is_current(target):
        stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
        with contextlib.suppress(OSError):  # another process may have moved it first
            target.rename(stale / target.name)
            logger.info("replaced %s, which was no longer current", target)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        staging.rename(target)
        logger.info("wrote %s", target)
    except OSError:
        if not is_current(target):
            raise
