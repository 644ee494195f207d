"""The loader's one seam: a checkpoint's tensors under HF names, read one at a time.

Two kinds of checkpoint directory exist: HF safetensors (``model.safetensors`` or an index of
shards) and a GGUF file's metadata directory (``engine.gguf.sidecar``), whose weights stay in
the GGUF file. Both give the loader the same :class:`CheckpointTensors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from engine.checkpoint.safetensors_files import SafetensorsTensors, checkpoint_files
from engine.gguf.gguf_tensors import GGUFTensors
from engine.gguf.sidecar import gguf_file_of
from engine.models.config import ModelArchConfig


class CheckpointTensors(Protocol):
    """The tensors of one checkpoint under their HF hub names."""

    def names(self) -> tuple[str, ...]:
        """Every tensor the checkpoint holds."""
        ...

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of ``name`` without reading it."""
        ...

    def read(self, name: str, index: tuple[int | slice, ...] | None = None) -> torch.Tensor:
        """``name`` (only the part ``index`` selects, where given) as a CPU tensor."""
        ...

    def close(self) -> None:
        """Release the files."""
        ...


@contextlib.contextmanager
def open_checkpoint_tensors(
    model_dir: str | Path, config: ModelArchConfig
) -> Iterator[CheckpointTensors]:
    """The tensors of the checkpoint in ``model_dir`` (described by ``config``), open for the
    ``with`` block."""
    gguf_path = gguf_file_of(Path(model_dir))
    tensors: CheckpointTensors = (
        SafetensorsTensors(checkpoint_files(model_dir))
        if gguf_path is None
        else GGUFTensors.open(Path(model_dir), gguf_path, config)
    )
    try:
        yield tensors
    finally:
        tensors.close()
