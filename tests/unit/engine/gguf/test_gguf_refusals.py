"""A GGUF file pdserve cannot load is refused when the model is resolved — before any engine or
replica exists — in one line naming the file and the defect: bad magic, truncation, an
unsupported architecture or tensor type, no tokenizer; a tensor it cannot place is named when
loading."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from core.errors import PdserveError, UnsupportedArchitectureError, WeightLoadError
from engine.builtin import resolve_model
from engine.loader import load_model
from tests.unit.engine.gguf.gguf_files import Q, quantized, write_gguf
from tests.unit.engine.models.hf_checkpoints import torch_backend

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache dir for the GGUF files' metadata directories."""
    tiny_llama = resolve_model("builtin:tiny-llama")  # from the shared cache, written once
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tiny_llama


def refusal(path: Path, kind: type[PdserveError]) -> str:
    with pytest.raises(kind) as info:
        resolve_model(str(path))
    message = info.value.message
    assert "\n" not in message and str(path) in message, message
    return message


def test_bad_magic(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGML" + bytes(64))
    assert "not a GGUF file (magic b'GGML'" in refusal(path, WeightLoadError)


@pytest.mark.parametrize("keep", [0.5, 0.01])
def test_truncated_file(tmp_path: Path, cache: Path, keep: float) -> None:
    whole = write_gguf(cache, tmp_path / "whole.gguf", quantized(Q.Q8_0)).path.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole[: int(len(whole) * keep)])
    assert "truncated" in refusal(path, WeightLoadError)


def test_unsupported_tensor_type(tmp_path: Path, cache: Path) -> None:
    def q2_k_down(name: str, values: np.ndarray) -> gguf.GGMLQuantizationType:
        return Q.Q2_K if name == "model.layers.1.mlp.down_proj.weight" else Q.F32

    path = write_gguf(cache, tmp_path / "q2k.gguf", q2_k_down).path
    message = refusal(path, WeightLoadError)
    assert "'blk.1.ffn_down.weight' has type Q2_K; supported: F32, F16, BF16, Q4_0" in message


def test_unsupported_architecture(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(path, "phi3")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    message = refusal(path, UnsupportedArchitectureError)
    assert "architecture 'phi3'; supported: llama, qwen2, qwen2moe, qwen3moe" in message


def test_no_tokenizer(tmp_path: Path, cache: Path) -> None:
    path = write_gguf(cache, tmp_path / "bare.gguf", quantized(Q.F32), tokenizer=False).path
    assert "carries no tokenizer" in refusal(path, WeightLoadError)


def test_a_tensor_it_cannot_place_is_named_when_loading(tmp_path: Path, cache: Path) -> None:
    """llama.cpp's Llama 3.1 files carry RoPE factors as a tensor; pdserve does not apply them."""
    rope_freqs = {"rope_freqs.weight": np.ones(16, dtype=np.float32)}
    path = write_gguf(cache, tmp_path / "rope.gguf", quantized(Q.F32), extra_tensors=rope_freqs)
    model_dir = resolve_model(str(path.path))
    with pytest.raises(WeightLoadError, match=r"unexpected tensor\(s\) 'rope_freqs\.weight'"):
        load_model(model_dir, dtype=torch.float32, device="cpu", attn_backend=torch_backend())
