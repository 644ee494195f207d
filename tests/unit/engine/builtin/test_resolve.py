"""Model resolution and the atomic, deterministic writing of built-in checkpoints."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from core.errors import ConfigError, ModelNotFoundError
from engine.builtin import builtin_model_names, resolve_model
from engine.builtin import resolve as resolve_module
from engine.builtin.resolve import ensure_builtin
from engine.builtin.specs import BUILTIN_SPECS, FORMAT_VERSION, TINY_SPECS
from engine.builtin.writer import MARKER_FILE, write_checkpoint

CHECKPOINT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    MARKER_FILE,
}


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def _leftovers(models_dir: Path) -> list[str]:
    return sorted(p.name for p in models_dir.iterdir() if p.name.startswith("."))


def test_builtin_names() -> None:
    assert builtin_model_names() == (
        "builtin:tiny-llama",
        "builtin:tiny-moe",
        "builtin:mid-moe",
        "builtin:llama-1b",
        "builtin:gpu-moe",
        "builtin:smollm2-135m-instruct",
    )


def test_resolve_writes_into_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = resolve_model("builtin:tiny-llama")
    assert path == tmp_path / "cache" / "models" / "tiny-llama"
    assert {p.name for p in path.iterdir()} == CHECKPOINT_FILES
    assert json.loads((path / MARKER_FILE).read_text())["format_version"] == FORMAT_VERSION

    def must_not_write(*args: object) -> None:
        raise AssertionError("a current checkpoint must not be rewritten")

    monkeypatch.setattr(resolve_module, "write_checkpoint", must_not_write)
    assert resolve_model("builtin:tiny-llama") == path
    assert _leftovers(path.parent) == []


def test_unknown_builtin_lists_the_builtins() -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("builtin:tiny-gpt")
    assert err.value.param == "model"
    assert "builtin:tiny-gpt" in err.value.message
    assert "builtin:tiny-llama" in err.value.message and "builtin:tiny-moe" in err.value.message


def test_paths(tmp_path: Path) -> None:
    assert resolve_model(str(tmp_path)) == tmp_path
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="no-such-model") as err:
        resolve_model(str(missing))
    assert err.value.param == "model"
    a_file = tmp_path / "model.safetensors"
    a_file.write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"model\.safetensors"):
        resolve_model(str(a_file))


def test_checkpoints_are_byte_deterministic(tmp_path: Path) -> None:
    for spec in TINY_SPECS.values():
        first, second = tmp_path / f"{spec.name}-a", tmp_path / f"{spec.name}-b"
        first.mkdir(), second.mkdir()
        write_checkpoint(spec, first)
        write_checkpoint(spec, second)
        assert _digests(first) == _digests(second)
        assert set(_digests(first)) == CHECKPOINT_FILES
    llama = _digests(tmp_path / "tiny-llama-a")["model.safetensors"]
    assert llama != _digests(tmp_path / "tiny-moe-a")["model.safetensors"]


def test_losing_the_rename_race_keeps_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = BUILTIN_SPECS["tiny-llama"]
    models_dir = tmp_path / "models"

    def racer_wins_first(spec_arg: object, staging: Path) -> None:
        # Another process installs its copy while this one is still writing.
        winner = models_dir / ".winner"
        winner.mkdir()
        write_checkpoint(spec, winner)
        winner.rename(models_dir / spec.name)
        (models_dir / spec.name / "winner-was-here").write_text("1")
        write_checkpoint(spec, staging)

    monkeypatch.setattr(resolve_module, "write_checkpoint", racer_wins_first)
    path = ensure_builtin(spec, models_dir)
    assert (path / "winner-was-here").exists()
    assert _leftovers(models_dir) == []


def test_concurrent_writers_agree(tmp_path: Path) -> None:
    spec = BUILTIN_SPECS["tiny-llama"]
    models_dir = tmp_path / "models"
    results: list[Path] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def resolve() -> None:
        try:
            barrier.wait(timeout=30)
            results.append(ensure_builtin(spec, models_dir))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=resolve) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and results == [models_dir / spec.name] * 3
    assert {p.name for p in (models_dir / spec.name).iterdir()} == CHECKPOINT_FILES
    assert _leftovers(models_dir) == []


def test_unwritable_cache_is_a_config_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(ConfigError, match="PDSERVE_CACHE_DIR") as err:
        ensure_builtin(BUILTIN_SPECS["tiny-llama"], not_a_dir / "models")
    assert err.value.param == "PDSERVE_CACHE_DIR"


def test_older_format_is_replaced(tmp_path: Path) -> None:
    spec = BUILTIN_SPECS["tiny-llama"]
    models_dir = tmp_path / "models"
    target = ensure_builtin(spec, models_dir)
    current = _digests(target)
    (target / MARKER_FILE).write_text(json.dumps({"name": spec.name, "format_version": 0}))
    (target / "model.safetensors").write_bytes(b"stale")
    assert ensure_builtin(spec, models_dir) == target
    assert _digests(target) == current
    assert _leftovers(models_dir) == []
