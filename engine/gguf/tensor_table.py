"""A GGUF file's tensor table saved in its metadata directory, so a load skips parsing the file.

``gguf.GGUFReader`` parses every metadata field before it lists a tensor: for a model with a
50K-token vocabulary that is seconds of Python per open, repeated by every process that loads
the model. :func:`write_table` saves what a load needs — the architecture and, per tensor, its
name, type, GGUF dimensions, data offset and byte count — next to the other metadata files
(``engine.gguf.sidecar``, whose marker makes the whole directory stale when the file changes);
:func:`mapped_tensors` memory-maps the file and gives each tensor's bytes as the reader would,
reading none of them; :func:`dequantize` reads one tensor, or one expert of it, as floats.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from core.errors import WeightLoadError
from engine.gguf.file import GGUFFile

TABLE_FILE = "pdserve_gguf_tensors.json"
# types whose data the reader maps as their own element type; every other type as raw bytes
_ELEMENT_DTYPES: Mapping[gguf.GGMLQuantizationType, type[np.generic]] = {
    gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F16: np.float16,
}


@dataclass(frozen=True)
class TableEntry:
    """One tensor as the file lists it: ``dims`` innermost first, ``data_offset`` in bytes from
    the start of the file."""

    name: str
    type_name: str
    dims: tuple[int, ...]
    data_offset: int
    n_bytes: int


@dataclass(frozen=True)
class MappedTensor:
    """One tensor's type, GGUF dimensions and bytes (a read-only view of the mapped file)."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class TensorTable:
    """What a load needs of a GGUF file besides its bytes."""

    architecture: str
    entries: tuple[TableEntry, ...]


def table_of(file: GGUFFile) -> TensorTable:
    """The tensor table of the opened, checked ``file``."""
    entries = tuple(
        TableEntry(
            name=tensor.name,
            type_name=tensor.tensor_type.name,
            dims=tuple(int(d) for d in tensor.shape),
            data_offset=int(tensor.data_offset),
            n_bytes=int(tensor.n_bytes),
        )
        for tensor in file.reader.tensors
    )
    return TensorTable(file.architecture, entries)


def write_table(file: GGUFFile, directory: Path) -> None:
    """Save ``file``'s tensor table in ``directory``."""
    table = table_of(file)
    body = {"architecture": table.architecture, "tensors": [asdict(e) for e in table.entries]}
    (directory / TABLE_FILE).write_text(json.dumps(body) + "\n", encoding="utf-8")


def read_table(directory: Path) -> TensorTable | None:
    """The table saved in ``directory``; None when there is none (a directory written before
    tables were)."""
    try:
        body: dict[str, Any] = json.loads((directory / TABLE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    entries = tuple(
        TableEntry(
            name=e["name"],
            type_name=e["type_name"],
            dims=tuple(e["dims"]),
            data_offset=e["data_offset"],
            n_bytes=e["n_bytes"],
        )
        for e in body["tensors"]
    )
    return TensorTable(body["architecture"], entries)


def mapped_tensors(gguf_path: Path, table: TensorTable) -> dict[str, MappedTensor]:
    """Every tensor of ``table`` as a view of ``gguf_path`` mapped read-only, by GGUF name.

    Raises :class:`WeightLoadError` when a tensor's bytes end past the end of the file.
    """
    mapped = np.memmap(gguf_path, dtype=np.uint8, mode="r")
    tensors = {}
    for entry in table.entries:
        end = entry.data_offset + entry.n_bytes
        if end > mapped.size:
            raise WeightLoadError(
                f"GGUF file {str(gguf_path)!r} is truncated: tensor {entry.name!r} ends at "
                f"byte {end}, the file has {mapped.size}",
                param="model",
            )
        tensors[entry.name] = _mapped(mapped, entry)
    return tensors


def _mapped(mapped: np.ndarray, entry: TableEntry) -> MappedTensor:
    tensor_type = gguf.GGMLQuantizationType[entry.type_name]
    raw = mapped[entry.data_offset : entry.data_offset + entry.n_bytes]
    dims = tuple(reversed(entry.dims))  # outermost first, as numpy indexes
    dtype = _ELEMENT_DTYPES.get(tensor_type)
    if dtype is None:  # blocks of raw bytes: rows of whole blocks
        data = raw.reshape(gguf.quant_shape_to_byte_shape(dims, tensor_type))
    else:
        data = raw.view(dtype).reshape(dims)
    return MappedTensor(entry.name, tensor_type, entry.dims, data)


def dequantize(tensor: MappedTensor, expert: int | None = None) -> np.ndarray:
    """``tensor`` (or one expert of a stacked expert tensor) as a float array in HF order
    ``[..., rows, cols]``; only those bytes are read from the mapped file."""
    raw = tensor.data if expert is None else tensor.data[expert]
    return np.asarray(gguf.dequantize(raw, tensor.tensor_type))
