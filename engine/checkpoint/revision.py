"""A checkpoint's revision: a content hash of its weights and config, computed once and cached.

Two directories with the same model name may hold different weights (a rolling upgrade to a new
fine-tune), and KV computed under one must never be read as the other's. The revision hashes
the bytes of every weight file (the safetensors shards, or the GGUF file a metadata directory
names) and of ``config.json``. Hashing a large checkpoint takes seconds, so the result is kept
in ``.pdserve_revision.json`` beside the files, keyed by each file's path, size and
modification time: a file that changed is hashed again. A directory that cannot be written
still gets its revision (computed each time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from engine.checkpoint.safetensors_files import checkpoint_files
from engine.gguf.sidecar import CONFIG_FILE, gguf_file_of

logger = logging.getLogger(__name__)

CACHE_FILE = ".pdserve_revision.json"
_READ_BYTES = 8 << 20


def checkpoint_revision(model_dir: str | Path) -> str:
    """The revision of the checkpoint in ``model_dir`` (32 hex digits)."""
    root = Path(model_dir)
    gguf = gguf_file_of(root)
    files = [root / CONFIG_FILE, *([gguf] if gguf is not None else checkpoint_files(root))]
    key = [_identity(path) for path in files]
    cache = root / CACHE_FILE
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if cached.get("files") == key:
            return str(cached["revision"])
    except (OSError, ValueError, AttributeError):
        pass
    digest = hashlib.blake2b(digest_size=16)
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(_READ_BYTES):
                digest.update(chunk)
    revision = digest.hexdigest()
    try:
        partial = cache.with_name(f"{CACHE_FILE}.{os.getpid()}")
        partial.write_text(json.dumps({"files": key, "revision": revision}), encoding="utf-8")
        partial.replace(cache)
    except OSError as e:
        logger.info("checkpoint revision of %s not cached: %s", root, e)
    return revision


def _identity(path: Path) -> list[str | int]:
    """What says a file is unchanged without reading it: path, size, modification time."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]
