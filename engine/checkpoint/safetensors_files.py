"""An HF checkpoint's safetensors files as one set of tensors (a ``CheckpointTensors``).

Files are opened with ``safetensors.safe_open`` (memory-mapped; never ``torch.load``, never
pickle). A read returns one tensor, or only the bytes of the slice asked for (one expert of a
fused expert tensor, a tensor-parallel rank's rows or columns).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from core.errors import ModelNotFoundError, WeightLoadError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class SafetensorsTensors:
    """The tensors of every safetensors file of one checkpoint, open until :meth:`close`."""

    def __init__(self, files: list[Path]) -> None:
        self._stack = contextlib.ExitStack()
        self._file_of: dict[str, Any] = {}  # tensor name -> its open file
        try:
            for path in files:
                handle = self._stack.enter_context(_open(path))
                self._file_of.update(dict.fromkeys(handle.keys(), handle))
        except BaseException:
            self._stack.close()
            raise

    def names(self) -> tuple[str, ...]:
        """Every tensor name, file by file."""
        return tuple(self._file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of ``name`` (from the header; nothing is read)."""
        return tuple(self._file_of[name].get_slice(name).get_shape())

    def read(self, name: str, index: tuple[int | slice, ...] | None = None) -> torch.Tensor:
        """``name`` whole, or only the bytes of ``index``."""
        handle = self._file_of[name]
        tensor: torch.Tensor = (
            handle.get_tensor(name) if index is None else handle.get_slice(name)[index]
        )
        return tensor

    def close(self) -> None:
        """Close every file."""
        self._stack.close()


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of ``model_dir``: the index's shards, or ``model.safetensors``."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelNotFoundError(f"model directory {str(root)!r} does not exist", param="model")
    index_path = root / INDEX_FILE
    if index_path.is_file():
        try:
            weight_files = json.loads(index_path.read_text())["weight_map"].values()
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise WeightLoadError(f"cannot read {str(index_path)!r}: {e!r}") from e
        files = [root / name for name in sorted(set(weight_files))]
    else:
        files = [root / SINGLE_FILE]
    for path in files:
        if not path.is_file():
            raise WeightLoadError(f"checkpoint file {str(path)!r} does not exist", param=path.name)
    return files


@contextlib.contextmanager
def _open(path: Path) -> Iterator[Any]:
    try:
        handle = safe_open(path, framework="pt")
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise WeightLoadError(f"cannot open {str(path)!r}: {e}", param=path.name) from e
    with handle as f:
        yield f
