"""The built-in checkpoints load into HF transformers cleanly and decode non-degenerately."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.builtin.resolve import ensure_builtin
from engine.builtin.specs import TINY_SPECS
from engine.tokenizer import Tokenizer

PROMPTS = ["Hello, world", "The quick brown fox", "1 2 3 4 5", "a", "zz a", "Once upon a time"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    for spec in TINY_SPECS.values():
        ensure_builtin(spec, directory)
    return directory


def _tensor_names(model_dir: Path) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def test_hub_tensor_names(models_dir: Path) -> None:
    llama = _tensor_names(models_dir / "tiny-llama")
    assert len(llama) == 1 + 4 * 9 + 2
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= llama
    assert "model.layers.3.self_attn.k_proj.weight" in llama
    assert not any(name.endswith(".bias") for name in llama)
    moe = _tensor_names(models_dir / "tiny-moe")
    assert "model.layers.0.mlp.gate.weight" in moe
    assert "model.layers.3.mlp.experts.7.down_proj.weight" in moe
    assert "model.layers.2.mlp.shared_expert.up_proj.weight" in moe
    assert "model.layers.1.mlp.shared_expert_gate.weight" in moe
    assert "model.layers.0.self_attn.q_proj.bias" in moe
    assert not any(".experts.8." in name for name in moe)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-moe"])
def test_hf_loads_cleanly_and_decodes_non_degenerately(models_dir: Path, name: str) -> None:
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        str(models_dir / name), output_loading_info=True
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and info["error_msgs"] == []
    config = model.config
    assert model.dtype == torch.float32
    assert config.num_hidden_layers >= 4
    assert config.num_attention_heads == 4 * config.num_key_value_heads  # GQA
    assert config.max_position_embeddings >= 65536
    assert config.rope_parameters["rope_theta"] == 1e6
    if name == "tiny-moe":
        assert (config.num_experts, config.num_experts_per_tok) == (8, 2)
        assert config.shared_expert_intermediate_size > 0

    continuations = _greedy_continuations(model, Tokenizer.from_dir(models_dir / name))
    for prompt, continuation in zip(PROMPTS, continuations, strict=True):
        assert len(set(continuation)) >= 8, (prompt, continuation)  # not stuck in a loop
    assert len(set(continuations)) == len(PROMPTS)
    # The context, not only the last token, decides: "a" and "zz a" end alike.
    assert continuations[PROMPTS.index("a")][:4] != continuations[PROMPTS.index("zz a")][:4]


def _greedy_continuations(model: torch.nn.Module, tokenizer: Tokenizer) -> list[tuple[int, ...]]:
    """24 greedy tokens for each prompt, in one left-padded batch."""
    encoded = [tokenizer.encode(prompt) for prompt in PROMPTS]
    width = max(len(ids) for ids in encoded)
    pad_id = tokenizer.pad_token_id
    assert pad_id is not None
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in encoded])
    attention_mask = torch.arange(width) >= torch.tensor([[width - len(ids)] for ids in encoded])
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            input_ids,
            attention_mask=attention_mask.long(),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad_id,
        )
    return [tuple(row[width:].tolist()) for row in out]
