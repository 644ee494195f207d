"""A GGUF file seen as an HF checkpoint directory: its metadata as files, its weights in place.

:func:`write_sidecar` turns the file's metadata into ``config.json``, the tokenizer files and
``generation_config.json`` (see :mod:`engine.gguf.hf_config`, :mod:`engine.gguf.tokenizer_files`),
the tensor table (:mod:`engine.gguf.tensor_table`, so a load need not parse the file again) plus
a marker naming the GGUF file, so every reader of checkpoint directories — the model
config, the tokenizer, the ingress, the sizer — reads a GGUF model as it reads any other, and
the loader reads the weights from the GGUF file itself (no copy of them is written). The marker
records the file's size and modification time: a changed file makes the directory stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from engine.gguf.file import GGUFFile
from engine.gguf.hf_config import hf_config
from engine.gguf.tensor_table import write_table
from engine.gguf.tokenizer_files import write_tokenizer_files
from engine.models.config import ModelArchConfig

MARKER_FILE = "pdserve_gguf.json"
CONFIG_FILE = "config.json"
# NOTE: bump when anything written here changes: directories of an older version are rewritten
FORMAT_VERSION = 2


def write_sidecar(gguf_path: Path, directory: Path) -> None:
    """Check ``gguf_path`` and write its metadata files into the empty ``directory``."""
    file = GGUFFile(gguf_path)
    config = hf_config(file)
    try:
        ModelArchConfig.from_hf_dict(config)  # refuse what the engine cannot run, naming the file
    except ConfigError as e:
        raise type(e)(f"GGUF file {str(file.path)!r}: {e.message}", param=e.param) from e
    _write_json(directory / CONFIG_FILE, config)
    write_tokenizer_files(file, directory)
    write_table(file, directory)
    # NOTE: the marker goes last; its presence means the other files are complete
    _write_json(directory / MARKER_FILE, marker(gguf_path))


def marker(gguf_path: Path) -> dict[str, Any]:
    """What identifies ``gguf_path``'s current contents (and this writer's version)."""
    path = gguf_path.expanduser().resolve()
    stat = path.stat()
    return {
        "gguf_file": str(path),
        "size_bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "format_version": FORMAT_VERSION,
    }


def is_current(directory: Path, gguf_path: Path) -> bool:
    """True when ``directory`` holds the complete metadata of ``gguf_path`` as it is now."""
    try:
        found = json.loads((directory / MARKER_FILE).read_text(encoding="utf-8"))
        return bool(found == marker(gguf_path))
    except (OSError, ValueError):
        return False


def gguf_file_of(directory: Path) -> Path | None:
    """The GGUF file whose metadata ``directory`` holds; None for an ordinary checkpoint."""
    marker_path = directory / MARKER_FILE
    if not marker_path.is_file():
        return None
    return Path(json.loads(marker_path.read_text(encoding="utf-8"))["gguf_file"])


def _write_json(path: Path, body: dict[str, Any]) -> None:
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
