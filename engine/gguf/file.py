"""Open a GGUF file with the ``gguf`` package and refuse what pdserve cannot load, in one line.

The checks run before any tensor is read: the magic, that the header and every tensor's bytes
lie inside the file (a truncated download fails here, not halfway through a load), that the
architecture is one pdserve maps, and that every tensor's type is one it dequantizes. Each
refusal is a :class:`WeightLoadError` or :class:`UnsupportedArchitectureError` naming the file
and the offending value.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf

from core.errors import ModelNotFoundError, UnsupportedArchitectureError, WeightLoadError

GGUF_SUFFIX = ".gguf"
MAGIC = b"GGUF"
Q = gguf.GGMLQuantizationType
SUPPORTED_TENSOR_TYPES = (
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
)  # fmt: skip
# GGUF ``general.architecture`` -> the HF architecture the engine runs (Mistral files are
# ``llama``; a ``llama`` file with experts is Mixtral).
ARCHITECTURES: Mapping[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}


def is_gguf_path(name: str | Path) -> bool:
    """True when ``name`` names a ``.gguf`` file (existing or not)."""
    return str(name).lower().endswith(GGUF_SUFFIX)


class GGUFFile:
    """One opened, checked GGUF file: its metadata and tensors (memory-mapped, not read)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise ModelNotFoundError(f"GGUF file {str(self.path)!r} does not exist", param="model")
        self._check_magic()
        try:
            self.reader = gguf.GGUFReader(self.path)
        except (ValueError, IndexError, KeyError, struct.error, OSError) as e:
            raise WeightLoadError(
                f"GGUF file {str(self.path)!r} is truncated or corrupt ({e})", param="model"
            ) from e
        self.tensors = {tensor.name: tensor for tensor in self.reader.tensors}
        self._check_extent()
        self.architecture = self._check_architecture()
        self._check_tensor_types()

    def field(self, key: str, default: Any = None) -> Any:
        """The value of metadata ``key`` (a scalar, a string, or a list), else ``default``."""
        found = self.reader.get_field(key)
        return default if found is None else found.contents()

    def arch_field(self, key: str, default: Any = None) -> Any:
        """The value of ``{architecture}.{key}`` (e.g. ``block_count``)."""
        return self.field(f"{self.architecture}.{key}", default)

    def _check_magic(self) -> None:
        with self.path.open("rb") as f:
            magic = f.read(len(MAGIC))
        if magic != MAGIC:
            raise WeightLoadError(
                f"{str(self.path)!r} is not a GGUF file (magic {magic!r}, expected {MAGIC!r})",
                param="model",
            )

    def _check_extent(self) -> None:
        """Every tensor's bytes inside the file (``gguf`` maps lazily and would fail later)."""
        size = self.path.stat().st_size
        for tensor in self.reader.tensors:
            end = int(tensor.data_offset) + int(tensor.n_bytes)
            if end > size:
                raise WeightLoadError(
                    f"GGUF file {str(self.path)!r} is truncated: tensor {tensor.name!r} ends at "
                    f"byte {end}, the file has {size}",
                    param="model",
                )

    def _check_architecture(self) -> str:
        architecture = self.field("general.architecture")
        if architecture not in ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"GGUF file {str(self.path)!r} has architecture {architecture!r}; supported: "
                + ", ".join(ARCHITECTURES),
                param="general.architecture",
            )
        return str(architecture)

    def _check_tensor_types(self) -> None:
        for tensor in self.reader.tensors:
            if tensor.tensor_type not in SUPPORTED_TENSOR_TYPES:
                raise WeightLoadError(
                    f"GGUF file {str(self.path)!r}: tensor {tensor.name!r} has type "
                    f"{tensor.tensor_type.name}; supported: "
                    + ", ".join(t.name for t in SUPPORTED_TENSOR_TYPES),
                    param=tensor.name,
                )
