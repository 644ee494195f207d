"""Write one built-in checkpoint, in the HF layout, into a directory.

The files are exactly what ``save_pretrained`` would leave for a real model (``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``), so built-ins go through the same loader and tokenizer code as real
checkpoints. Every file is byte-deterministic. A small marker file records the format version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from engine.builtin import byte_tokenizer
from engine.builtin.specs import FORMAT_VERSION, BuiltinSpec
from engine.builtin.weights import build_weights

MARKER_FILE = "pdserve_builtin.json"
WEIGHTS_FILE = "model.safetensors"


def write_checkpoint(spec: BuiltinSpec, directory: Path) -> None:
    """Write ``spec``'s complete checkpoint into the existing, empty ``directory``."""
    _write_json(directory / "config.json", spec.config)
    write_tokenizer_files(spec, directory)
    save_file(build_weights(spec), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    # NOTE: the marker goes last; its presence means the other files are complete.
    _write_json(directory / MARKER_FILE, marker(spec))


def write_tokenizer_files(spec: BuiltinSpec, directory: Path) -> None:
    """Write only the tokenizer side (tokenizer, tokenizer and generation configs)."""
    _write_json(directory / "generation_config.json", byte_tokenizer.generation_config())
    _write_json(directory / "tokenizer_config.json", byte_tokenizer.tokenizer_config())
    _write_json(directory / "special_tokens_map.json", _special_tokens_map())
    vocab_size = int(spec.config["vocab_size"])
    tokenizer_json = byte_tokenizer.build_tokenizer(vocab_size).to_str(pretty=True)
    (directory / "tokenizer.json").write_text(tokenizer_json + "\n", encoding="utf-8")


def marker(spec: BuiltinSpec) -> dict[str, Any]:
    """The marker body identifying which built-in (and which format version) a directory holds."""
    return {"name": spec.name, "format_version": FORMAT_VERSION}


def _special_tokens_map() -> dict[str, str]:
    config = byte_tokenizer.tokenizer_config()
    return {key: config[key] for key in ("bos_token", "eos_token", "pad_token")}


def _write_json(path: Path, body: dict[str, Any]) -> None:
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
