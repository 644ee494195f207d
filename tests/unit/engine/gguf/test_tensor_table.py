"""The tensor table saved in a GGUF file's metadata directory: a load from a current directory
parses nothing and reads what a parse would (one without a table parses the file); a changed file
is parsed again (its stale table unused) and its directory rewritten with the new table; a table
longer than the file refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest
import torch

import engine.gguf.file
from core.errors import WeightLoadError
from engine.builtin import resolve_model
from engine.builtin.resolve import ensure_gguf_dir
from engine.gguf.file import GGUFFile
from engine.gguf.gguf_tensors import GGUFTensors
from engine.gguf.tensor_table import TABLE_FILE, mapped_tensors, read_table, table_of
from engine.models.config import ModelArchConfig
from tests.unit.engine.gguf.gguf_files import Q, f32_everywhere, quantized, write_gguf

pytestmark = pytest.mark.timeout(60)
READER = gguf.GGUFReader


class CountingReader:
    """``gguf.GGUFReader``, counting the files it parses."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def __call__(self, path: Any) -> gguf.GGUFReader:
        self.paths.append(Path(path))
        return READER(path)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> CountingReader:
    counter = CountingReader()
    monkeypatch.setattr(engine.gguf.file.gguf, "GGUFReader", counter)
    return counter


def parsed(path: Path, config: ModelArchConfig) -> GGUFTensors:
    """The tensors as a fresh parse of ``path`` gives them."""
    table = table_of(GGUFFile(path))
    return GGUFTensors(mapped_tensors(path, table), table.architecture, config)


def assert_same_tensors(got: GGUFTensors, want: GGUFTensors) -> None:
    assert got.names() == want.names()
    for name in want.names():
        assert got.shape(name) == want.shape(name), name
        assert torch.equal(got.read(name), want.read(name)), name


def test_a_current_directory_loads_without_parsing(tmp_path: Path, parses: CountingReader) -> None:
    hf_dir = resolve_model("builtin:tiny-llama")
    path = write_gguf(hf_dir, tmp_path / "m.gguf", quantized(Q.Q4_K)).path
    directory = ensure_gguf_dir(path, tmp_path / "dir")
    assert parses.paths  # writing the directory checks the file (and builds its tokenizer)
    parses.paths.clear()
    config = ModelArchConfig.from_dir(directory)
    tensors = GGUFTensors.open(directory, path, config)
    assert parses.paths == []
    assert_same_tensors(tensors, parsed(path, config))
    (directory / TABLE_FILE).unlink()  # a directory without a table: the file is parsed
    parses.paths.clear()
    assert_same_tensors(GGUFTensors.open(directory, path, config), tensors)
    assert parses.paths == [path]


def test_a_changed_file_is_parsed_again_and_its_table_rewritten(
    tmp_path: Path, parses: CountingReader
) -> None:
    hf_dir = resolve_model("builtin:tiny-llama")
    path = write_gguf(hf_dir, tmp_path / "m.gguf", quantized(Q.Q8_0)).path
    directory = ensure_gguf_dir(path, tmp_path / "dir")
    stale = read_table(directory)
    config = ModelArchConfig.from_dir(directory)
    # the same tensors stored as F32: other sizes and offsets, other bytes
    changed = write_gguf(hf_dir, path, f32_everywhere, seed=1)
    parses.paths.clear()
    tensors = GGUFTensors.open(directory, path, config)
    assert parses.paths == [path]
    for name, want in changed.expected.items():
        assert torch.equal(tensors.read(name), want), name
    ensure_gguf_dir(path, directory)
    fresh = read_table(directory)
    assert fresh is not None and fresh != stale
    assert fresh == table_of(GGUFFile(path))
    parses.paths.clear()
    assert_same_tensors(GGUFTensors.open(directory, path, config), parsed(path, config))
    assert parses.paths == [path]  # the reference parse above, not the load


def test_a_table_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    hf_dir = resolve_model("builtin:tiny-llama")
    path = write_gguf(hf_dir, tmp_path / "m.gguf", f32_everywhere).path
    table = table_of(GGUFFile(path))
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[: table.entries[-1].data_offset + 4])
    with pytest.raises(WeightLoadError, match="is truncated: tensor"):
        mapped_tensors(short, table)
