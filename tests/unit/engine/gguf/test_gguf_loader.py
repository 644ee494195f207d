"""GGUF files the tests write from HF checkpoints (``gguf``'s writer, names and quantizers) load
into exactly what they hold: every architecture pdserve maps, every supported tensor type, the
llama Q/K permutation undone, experts read one at a time, the tokenizer from the metadata."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import engine.gguf.gguf_tensors
from core.sampling import SamplingParams
from engine.builtin import resolve_model
from engine.builtin.resolve import ensure_gguf_dir
from engine.llm import LLM
from engine.loader import load_model
from engine.models.config import ModelArchConfig
from engine.models.weight_map import build_weight_map
from engine.tokenizer import Tokenizer
from tests.unit.engine.gguf.gguf_files import (
    Q,
    QTypeOf,
    WrittenGGUF,
    f32_everywhere,
    quantized,
    write_gguf,
)
from tests.unit.engine.models.hf_checkpoints import (
    add_byte_tokenizer,
    save_checkpoint,
    torch_backend,
)

pytestmark = pytest.mark.timeout(120)

# tiny-llama with every supported type at least once (K-quants need rows of 256: all but k/v)
_EVERY_TYPE = {
    "model.embed_tokens.weight": Q.Q8_0,
    "lm_head.weight": Q.Q6_K,
    "model.layers.0.self_attn.q_proj.weight": Q.F16,
    "model.layers.0.self_attn.k_proj.weight": Q.BF16,
    "model.layers.0.self_attn.v_proj.weight": Q.Q4_K,
    "model.layers.0.self_attn.o_proj.weight": Q.Q5_K,
    "model.layers.0.mlp.gate_proj.weight": Q.Q4_0,
    "model.layers.0.mlp.up_proj.weight": Q.Q4_1,
    "model.layers.0.mlp.down_proj.weight": Q.Q6_K,
    "model.layers.1.self_attn.q_proj.weight": Q.Q5_0,
    "model.layers.1.self_attn.k_proj.weight": Q.Q5_1,
}


def every_type(name: str, values: np.ndarray) -> Any:
    return _EVERY_TYPE.get(name) or quantized(Q.Q8_0)(name, values)


# (checkpoint, GGUF architecture it becomes, how its tensors are stored)
CASES: dict[str, tuple[str, QTypeOf]] = {
    "llama-every-type": ("builtin:tiny-llama", every_type),
    "qwen2moe-q8_0": ("builtin:tiny-moe", quantized(Q.Q8_0)),
    "qwen2-q4_0": ("qwen2", quantized(Q.Q4_0)),
    "qwen3moe-q5_1": ("qwen3-moe", quantized(Q.Q5_1)),
    "mixtral-f16": ("mixtral", quantized(Q.F16)),
}


def checkpoint_dir(source: str, tmp_path: Path) -> Path:
    """A built-in's cached directory, or a transformers preset saved with a byte tokenizer."""
    if source.startswith("builtin:"):
        return resolve_model(source)
    path = save_checkpoint(source, tmp_path / source).path
    add_byte_tokenizer(path)
    return path


def written(case: str, tmp_path: Path) -> tuple[Path, WrittenGGUF, Path]:
    """(the HF checkpoint, the GGUF written from it, the GGUF's metadata directory)."""
    source, qtype_of = CASES[case]
    hf_dir = checkpoint_dir(source, tmp_path)
    gguf = write_gguf(hf_dir, tmp_path / f"{case}.gguf", qtype_of)
    return hf_dir, gguf, ensure_gguf_dir(gguf.path, tmp_path / f"{case}-dir")


def load(model_dir: Path, **kwargs: Any):
    return load_model(
        model_dir, dtype=torch.float32, device="cpu", attn_backend=torch_backend(), **kwargs
    )


def assert_holds(model: torch.nn.Module, config: ModelArchConfig, expected: dict) -> None:
    """Every parameter slot of ``model`` equals the expected tensor bit for bit."""
    params = dict(model.named_parameters())
    weight_map = build_weight_map(config, expected)
    assert set(weight_map.expected) == set(expected) - weight_map.skipped
    for name, slots in weight_map.expected.items():
        for slot in slots:
            dst = params[slot.param].data
            dst = dst if slot.expert is None else dst[slot.expert]
            held = dst.narrow(0, slot.row_start, slot.shape[0])
            assert torch.equal(held, expected[name]), name


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_loads_exactly_what_it_holds(case: str, tmp_path: Path) -> None:
    hf_dir, gguf, gguf_dir = written(case, tmp_path)
    if case == "llama-every-type":
        assert {q.name for q in gguf.qtypes.values()} == {
            "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
        }  # fmt: skip
    ours, theirs = ModelArchConfig.from_dir(gguf_dir), ModelArchConfig.from_dir(hf_dir)
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-6)
    same_ids = {"rms_norm_eps": theirs.rms_norm_eps, "bos_token_id": theirs.bos_token_id,
                "eos_token_ids": theirs.eos_token_ids}  # fmt: skip
    assert dataclasses.replace(ours, **same_ids) == theirs
    assert_holds(load(gguf_dir), ours, gguf.expected)


def test_experts_a_rank_does_not_own_are_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    *_, gguf_dir = written("qwen2moe-q8_0", tmp_path)
    reads: list[tuple[str, int | None]] = []
    real = engine.gguf.gguf_tensors.dequantize

    def spy(tensor: Any, expert: int | None = None) -> np.ndarray:
        reads.append((tensor.name, expert))
        return real(tensor, expert)

    monkeypatch.setattr(engine.gguf.gguf_tensors, "dequantize", spy)
    model = load(gguf_dir, expert_ids=[5, 1])
    expert_reads = [(name, e) for name, e in reads if re.search(r"_exps\.", name)]
    assert expert_reads and {e for _, e in expert_reads} == {1, 5}
    assert all(name.count("_exps") == 1 for name, _ in expert_reads)
    assert model.layers[0].mlp.expert_ids == (1, 5)


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_llm_serves_a_gguf_path_as_its_checkpoint(
    quantization: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LLM(model="x.gguf")``: the same greedy tokens and stop ids as the checkpoint it was
    written from (F32, so the weights are identical), also quantized to int8 at load."""
    hf_dir = resolve_model("builtin:tiny-llama")
    gguf = write_gguf(hf_dir, tmp_path / "tiny-llama.gguf", f32_everywhere)
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))  # the GGUF's metadata dir
    kwargs: dict[str, Any] = {"max_model_len": 256, "kv_cache_memory_bytes": 4 << 20,
                              "quantization": quantization}  # fmt: skip
    ours = LLM(str(gguf.path), **kwargs)
    reference = LLM(str(hf_dir), **kwargs)
    assert ours.engine.parts.eos_token_ids == reference.engine.parts.eos_token_ids == (257, 259)
    chat = [{"role": "user", "content": "héllo, wörld"}]
    assert ours.tokenizer.apply_chat_template(chat) == reference.tokenizer.apply_chat_template(chat)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    got = ours.chat([chat], params, use_tqdm=False)[0].outputs[0]
    want = reference.chat([chat], params, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want.token_ids and got.text == want.text


def test_the_tokenizer_comes_from_the_metadata(tmp_path: Path) -> None:
    hf_dir, _, gguf_dir = written("qwen2moe-q8_0", tmp_path)
    ours, theirs = Tokenizer.from_dir(gguf_dir), Tokenizer.from_dir(hf_dir)
    text = "<|im_start|>user\nnaïve 🙂<|im_end|>"
    assert ours.encode(text) == theirs.encode(text)
    assert ours.bos_token_id == theirs.bos_token_id
    assert ours.eos_token_ids == theirs.eos_token_ids  # EOS, then the end of a chat turn
