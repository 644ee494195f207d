"""A GGUF file's tensors under HF names, dequantized one at a time (a ``CheckpointTensors``).

The tensors come from the table saved in the file's metadata directory
(:mod:`engine.gguf.tensor_table`) when the directory is current, else from parsing the file. Each
read dequantizes one tensor — or one expert of a stacked expert tensor, whose bytes alone
are read — with the ``gguf`` package into float32, in HF order, and undoes llama.cpp's Q/K row
permutation for the ``llama`` architecture: its converter interleaves each head's two rotary
halves (``permute`` in ``convert_hf_to_gguf.py``) for RoPE on neighbouring pairs, where the
engine, like transformers, rotates the halves.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from engine.gguf.file import GGUFFile
from engine.gguf.names import PERMUTED_KEYS, TensorRef, hf_names
from engine.gguf.sidecar import is_current
from engine.gguf.tensor_table import MappedTensor, dequantize, mapped_tensors, read_table, table_of
from engine.models.config import ModelArchConfig

SHARED_EXPERT_GATE = "ffn_gate_inp_shexp"  # [H] in GGUF, [1, H] in HF


class GGUFTensors:
    """The tensors of one GGUF file, for the loader; names it cannot map keep their GGUF name
    (the loader reports them as unexpected)."""

    def __init__(
        self, tensors: Mapping[str, MappedTensor], architecture: str, config: ModelArchConfig
    ) -> None:
        self._tensors = tensors
        self._config = config
        self._refs: dict[str, TensorRef] = {}
        for gguf_name in tensors:
            self._refs.update(hf_names(gguf_name, config) or {gguf_name: TensorRef(gguf_name)})
        self._permutes = architecture == "llama"

    @classmethod
    def open(cls, directory: Path, gguf_path: Path, config: ModelArchConfig) -> GGUFTensors:
        """The tensors of ``gguf_path``, whose metadata ``directory`` holds: from the table
        saved there while the file is unchanged (no parse), else parsed and checked anew."""
        table = read_table(directory) if is_current(directory, gguf_path) else None
        if table is None:
            table = table_of(GGUFFile(gguf_path))
        return cls(mapped_tensors(gguf_path, table), table.architecture, config)

    def names(self) -> tuple[str, ...]:
        """Every tensor's HF name (a stacked expert tensor: one per expert), in file order."""
        return tuple(self._refs)

    def shape(self, name: str) -> tuple[int, ...]:
        """The HF shape of ``name`` (GGUF lists dimensions innermost first)."""
        ref = self._refs[name]
        dims = tuple(int(d) for d in reversed(self._tensors[ref.gguf_name].shape))
        if ref.expert is not None:
            dims = dims[1:]
        if ref.key == SHARED_EXPERT_GATE:
            dims = (1, dims[-1])
        return dims

    def read(self, name: str, index: tuple[int | slice, ...] | None = None) -> torch.Tensor:
        """``name`` dequantized to float32 (``index``: a tensor-parallel rank's slice of it)."""
        ref = self._refs[name]
        values = dequantize(self._tensors[ref.gguf_name], ref.expert)
        values = values.reshape(self.shape(name))
        if self._permutes and ref.key in PERMUTED_KEYS:
            heads = getattr(self._config, f"num_{PERMUTED_KEYS[ref.key]}")
            values = unpermute_rows(values, heads)
        # NOTE: F32 data is a read-only view of the mapped file; torch needs its own copy
        tensor = torch.from_numpy(np.require(values, np.float32, ["C", "W"]))
        return tensor if index is None else tensor[index]

    def close(self) -> None:
        """Nothing to release: the mapping goes with the file object."""


def unpermute_rows(values: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, n_head)``: each head's rows, stored interleaved
    ``[d/2, 2]``, go back to the HF order ``[2, d/2]`` (the first rotary half, then the second)."""
    rows = values.shape[0]
    split = values.reshape(num_heads, rows // num_heads // 2, 2, *values.shape[1:])
    return split.swapaxes(1, 2).reshape(values.shape)
