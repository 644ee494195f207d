"""The safetensors loader: layouts (single, sharded, fused experts), owned experts, and errors."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import engine.checkpoint.safetensors_files
from core.errors import ModelNotFoundError, UnsupportedArchitectureError, WeightLoadError
from engine.attention.metadata import AttentionMetadata
from engine.loader import load_model
from engine.models.moe import MoELayer
from tests.unit.engine.models.hf_checkpoints import new_kv_cache, save_checkpoint, torch_backend

PROMPT = [5, 9, 200, 31, 77, 4, 18]


def load(path: Path, **kwargs: Any):
    return load_model(
        path, dtype=torch.float32, device="cpu", attn_backend=torch_backend(), **kwargs
    )


def prompt_logits(model) -> torch.Tensor:
    n = len(PROMPT)
    meta = AttentionMetadata.build([n], [n], [[0, 1]], 4)
    with torch.no_grad():
        hidden = model(torch.tensor(PROMPT), torch.arange(n), new_kv_cache(model, 2, 4), meta)
        return model.compute_logits(hidden)


def hf_logits(hf_model) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([PROMPT])).logits[0]


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite_tensors(path: Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_sharded_checkpoint_loads_every_shard(tmp_path) -> None:
    ckpt = save_checkpoint("mixtral", tmp_path / "ckpt", max_shard_size="40KB")
    index = json.loads((ckpt.path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (ckpt.path / "model.safetensors").exists()
    torch.testing.assert_close(
        prompt_logits(load(ckpt.path)), hf_logits(ckpt.hf_model), atol=2e-5, rtol=1e-5
    )


@pytest.mark.parametrize("preset", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_fused_expert_layout_loads(tmp_path, preset: str) -> None:
    ckpt = save_checkpoint(preset, tmp_path / "ckpt", original_format=False)
    with safe_open(ckpt.path / "model.safetensors", framework="pt") as f:
        assert any(name.endswith("experts.gate_up_proj") for name in f.keys())  # noqa: SIM118
    torch.testing.assert_close(
        prompt_logits(load(ckpt.path)), hf_logits(ckpt.hf_model), atol=2e-5, rtol=1e-5
    )


class _SpyFile:
    """Wraps a safetensors file and logs every read as (tensor name, index or None)."""

    def __init__(self, f: Any, reads: list[tuple[str, Any]]) -> None:
        self.f, self.reads = f, reads

    def keys(self) -> list[str]:
        return list(self.f.keys())

    def get_tensor(self, name: str) -> torch.Tensor:
        self.reads.append((name, None))
        return self.f.get_tensor(name)

    def get_slice(self, name: str) -> Any:
        spy = self

        class _Slice:
            def get_shape(self) -> list[int]:
                return spy.f.get_slice(name).get_shape()

            def __getitem__(self, index: Any) -> torch.Tensor:
                spy.reads.append((name, index))
                return spy.f.get_slice(name)[index]

        return _Slice()


@pytest.fixture
def read_log(monkeypatch) -> list[tuple[str, Any]]:
    reads: list[tuple[str, Any]] = []

    @contextlib.contextmanager
    def spy_open(path: Path, framework: str) -> Iterator[_SpyFile]:
        with safe_open(path, framework=framework) as f:
            yield _SpyFile(f, reads)

    monkeypatch.setattr(engine.checkpoint.safetensors_files, "safe_open", spy_open)
    return reads


def _expert_ids_read(reads: list[tuple[str, Any]]) -> set[int]:
    """Global expert ids whose weights were read (per-expert names or fused-tensor indices)."""
    ids = set()
    for name, index in reads:
        if ".experts." not in name:
            continue
        suffix = name.split(".experts.")[1]
        if index is None:  # a per-expert tensor, read whole
            ids.add(int(suffix.split(".")[0]))
        else:  # a fused tensor: the expert is the first index (then a rank's slice, if any)
            ids.add(index[0] if isinstance(index, tuple) else index)
    return ids


@pytest.mark.parametrize("original_format", [True, False])
def test_owned_experts_only_are_allocated_and_read(tmp_path, read_log, original_format) -> None:
    ckpt = save_checkpoint("qwen2-moe", tmp_path / "ckpt", original_format=original_format)
    full = load(ckpt.path)
    assert _expert_ids_read(read_log) == set(range(8))
    read_log.clear()
    model = load(ckpt.path, expert_ids=[5, 1])
    assert _expert_ids_read(read_log) == {1, 5}
    moe_layers = [i for i, layer in enumerate(model.layers) if isinstance(layer.mlp, MoELayer)]
    assert moe_layers == [0, 2]
    for i in moe_layers:
        part, whole = model.layers[i].mlp, full.layers[i].mlp
        assert part.expert_ids == (1, 5)
        assert part.gate_up_proj.shape == (2, 64, 64)
        torch.testing.assert_close(part.gate_up_proj, whole.gate_up_proj[[1, 5]], rtol=0, atol=0)
        torch.testing.assert_close(part.down_proj, whole.down_proj[[1, 5]], rtol=0, atol=0)
        torch.testing.assert_close(part.gate.weight, whole.gate.weight, rtol=0, atol=0)


def test_missing_directory(tmp_path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelNotFoundError, match="nope"):
        load(missing)


def test_missing_config(tmp_path, hf_checkpoint) -> None:
    path = copy_checkpoint(hf_checkpoint("llama").path, tmp_path / "ckpt")
    (path / "config.json").unlink()
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        load(path)


def test_missing_weights_file(tmp_path, hf_checkpoint) -> None:
    path = copy_checkpoint(hf_checkpoint("llama").path, tmp_path / "ckpt")
    (path / "model.safetensors").unlink()
    with pytest.raises(WeightLoadError, match=r"model\.safetensors") as info:
        load(path)
    assert info.value.param == "model.safetensors"


def test_missing_shard(tmp_path) -> None:
    ckpt = save_checkpoint("llama", tmp_path / "ckpt", max_shard_size="40KB")
    shard = sorted(ckpt.path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(WeightLoadError, match=shard.name):
        load(ckpt.path)


def test_unsupported_architecture_lists_supported(tmp_path, hf_checkpoint) -> None:
    path = copy_checkpoint(hf_checkpoint("llama").path, tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel") as info:
        load(path)
    for arch in ("LlamaForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"):
        assert arch in info.value.message


def test_missing_tensor_is_named(tmp_path, hf_checkpoint) -> None:
    path = copy_checkpoint(hf_checkpoint("qwen2").path, tmp_path / "ckpt")
    name = "model.layers.1.self_attn.k_proj.bias"
    rewrite_tensors(path, lambda tensors: tensors.pop(name))
    with pytest.raises(WeightLoadError, match="missing") as info:
        load(path)
    assert name in info.value.message
    assert info.value.param == name


def test_unexpected_tensor_is_named(tmp_path, hf_checkpoint) -> None:
    path = copy_checkpoint(hf_checkpoint("llama").path, tmp_path / "ckpt")
    name = "model.layers.0.self_attn.extra_proj.weight"
    rewrite_tensors(path, lambda tensors: tensors.update({name: torch.zeros(2, 2)}))
    with pytest.raises(WeightLoadError, match="unexpected") as info:
        load(path)
    assert name in info.value.message


def test_wrong_shape_names_tensor_and_both_shapes(tmp_path, hf_checkpoint) -> None:
    path = copy_checkpoint(hf_checkpoint("mixtral").path, tmp_path / "ckpt")
    name = "model.layers.1.block_sparse_moe.experts.2.w2.weight"
    rewrite_tensors(path, lambda tensors: tensors.update({name: torch.zeros(64, 40)}))
    with pytest.raises(WeightLoadError) as info:
        load(path)
    assert name in info.value.message
    assert "[64, 40]" in info.value.message and "[64, 48]" in info.value.message


def test_tied_checkpoint_may_carry_lm_head(tmp_path, hf_checkpoint) -> None:
    ckpt = hf_checkpoint("qwen2")
    path = copy_checkpoint(ckpt.path, tmp_path / "ckpt")
    rewrite_tensors(
        path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()})
    )
    torch.testing.assert_close(
        prompt_logits(load(path)), hf_logits(ckpt.hf_model), atol=2e-5, rtol=1e-5
    )
