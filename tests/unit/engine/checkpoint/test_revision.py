"""A checkpoint's revision follows its bytes: equal contents agree wherever they lie, one changed
byte (weights or config) changes it, a GGUF directory hashes the file it names, and the cached
result is reused only while every file is unchanged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.checkpoint import checkpoint_revision
from engine.checkpoint.revision import CACHE_FILE
from engine.gguf.sidecar import MARKER_FILE

pytestmark = pytest.mark.timeout(30)


def checkpoint(root: Path, weights: bytes = b"w" * 1000, config: str = '{"a": 1}') -> Path:
    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(weights)
    (root / "config.json").write_text(config)
    return root


def test_equal_contents_agree_and_any_changed_byte_differs(tmp_path: Path) -> None:
    one = checkpoint_revision(checkpoint(tmp_path / "one"))
    assert len(one) == 32
    assert checkpoint_revision(checkpoint(tmp_path / "two")) == one
    assert checkpoint_revision(checkpoint(tmp_path / "w", weights=b"w" * 999 + b"x")) != one
    assert checkpoint_revision(checkpoint(tmp_path / "c", config='{"a": 2}')) != one


def test_sharded_checkpoints_hash_every_shard(tmp_path: Path) -> None:
    def sharded(name: str, second: bytes) -> Path:
        root = tmp_path / name
        root.mkdir()
        (root / "a.safetensors").write_bytes(b"first")
        (root / "b.safetensors").write_bytes(second)
        index = {"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
        (root / "config.json").write_text("{}")
        return root

    assert checkpoint_revision(sharded("p", b"second")) != checkpoint_revision(sharded("q", b"2nd"))


def test_a_gguf_directory_hashes_the_file_it_names(tmp_path: Path) -> None:
    def gguf_dir(name: str, contents: bytes) -> Path:
        gguf = tmp_path / f"{name}.gguf"
        gguf.write_bytes(contents)
        root = tmp_path / name
        root.mkdir()
        (root / "config.json").write_text("{}")
        (root / MARKER_FILE).write_text(json.dumps({"gguf_file": str(gguf)}))
        return root

    assert checkpoint_revision(gguf_dir("a", b"GGUF1")) != checkpoint_revision(
        gguf_dir("b", b"GGUF2")
    )


def test_the_cache_is_reused_only_while_the_files_are_unchanged(tmp_path: Path) -> None:
    root = checkpoint(tmp_path / "m")
    first = checkpoint_revision(root)
    cache = root / CACHE_FILE
    stored = json.loads(cache.read_text())
    assert stored["revision"] == first
    # a planted value proves the cache is read rather than the files hashed again
    cache.write_text(json.dumps({**stored, "revision": "planted"}))
    assert checkpoint_revision(root) == "planted"
    weights = root / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    assert checkpoint_revision(root) == first  # touched: hashed again, same bytes
