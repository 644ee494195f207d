"""Parsing HF config.json into ModelArchConfig, RoPE frequencies, and the weight map's coverage."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from core.errors import ConfigError, UnsupportedArchitectureError
from core.kv_layout import KVLayout
from engine.models.config import ModelArchConfig, RopeScaling
from engine.models.decoder import CausalLM
from engine.models.rope import rope_inv_freq
from engine.models.weight_map import build_weight_map
from tests.unit.engine.models.hf_checkpoints import PRESETS, torch_backend

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "eos_token_id": [128001, 128009],
    "bos_token_id": 128000,
}


def parse(raw: dict[str, Any]) -> ModelArchConfig:
    return ModelArchConfig.from_hf_dict(raw)


@pytest.fixture
def saved_config(hf_checkpoint) -> Callable[[str], ModelArchConfig]:
    """``saved_config(preset)``: the preset's config.json as written by ``save_pretrained``."""
    return lambda preset: ModelArchConfig.from_dir(hf_checkpoint(preset).path)


def test_llama_defaults_and_eos_list() -> None:
    cfg = parse(LLAMA)
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.rope_theta) == (8, 2, 10000.0)
    assert cfg.eos_token_ids == (128001, 128009) and cfg.bos_token_id == 128000
    assert not cfg.is_moe and cfg.rope_scaling is None and cfg.max_model_len == 4096
    assert cfg.kv_layout("m", "float32", 16, hash_seed=7) == KVLayout(
        "m", "float32", 16, 2, 2, 8, 7
    )


def test_old_style_llama3_rope_scaling() -> None:
    raw = {
        **LLAMA,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    cfg = parse(raw)
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert parse({**LLAMA, "rope_scaling": {"type": "linear", "factor": 2}}).rope_scaling == (
        RopeScaling("linear", 2.0, original_max_position_embeddings=4096)
    )


@pytest.mark.parametrize("preset", ["llama", "llama3", "llama-mqa"])
def test_rope_frequencies_bit_identical_to_hf(hf_checkpoint, preset: str) -> None:
    hf_config = hf_checkpoint(preset).hf_model.config
    rope_type = hf_config.rope_parameters["rope_type"]
    if rope_type == "default":
        base, dim = hf_config.rope_parameters["rope_theta"], hf_config.head_dim
        expected = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    cfg = parse(json.loads(hf_config.to_json_string()))
    assert torch.equal(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), expected)


def test_family_traits_from_saved_configs(saved_config) -> None:
    llama3, mqa, qwen2 = saved_config("llama3"), saved_config("llama-mqa"), saved_config("qwen2")
    assert llama3.head_dim == 24 and llama3.tie_word_embeddings
    assert llama3.rope_scaling is not None and llama3.rope_scaling.rope_type == "llama3"
    assert mqa.num_kv_heads == 1 and mqa.qkv_bias and mqa.o_bias
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.sliding_window is None
    mistral = saved_config("mistral")
    assert mistral.head_dim == 40 and mistral.sliding_window == 256
    assert mistral.max_model_len == 512  # the context is no longer capped at the window
    assert mistral.all_layers_windowed and mistral.layer_window(0) == 256
    qwen3 = saved_config("qwen3-moe")
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.num_experts == 8 and qwen3.norm_topk_prob
    mixtral = saved_config("mixtral")
    assert (mixtral.num_experts, mixtral.top_k, mixtral.moe_intermediate_size) == (4, 2, 48)
    assert mixtral.norm_topk_prob and mixtral.shared_expert_intermediate_size == 0


def test_moe_layer_selection(saved_config) -> None:
    qwen2_moe, sparse = saved_config("qwen2-moe"), saved_config("qwen2-moe-sparse")
    assert [qwen2_moe.is_moe_layer(i) for i in range(3)] == [True, False, True]
    assert qwen2_moe.shared_expert_intermediate_size == 48 and not qwen2_moe.norm_topk_prob
    assert [sparse.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert all(saved_config("mixtral").is_moe_layer(i) for i in range(2))


def test_mistral_null_sliding_window_means_full_context() -> None:
    raw = {**LLAMA, "architectures": ["MistralForCausalLM"]}
    assert parse(raw).sliding_window == 4096  # the HF default when the key is absent
    assert parse({**raw, "sliding_window": None}).max_model_len == 4096
    assert parse({**raw, "sliding_window": None}).sliding_window is None


def test_qwen_sliding_window_only_when_enabled_and_from_max_window_layers() -> None:
    raw = {**LLAMA, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 128}
    assert parse(raw).sliding_window is None and parse(raw).window_layers == ()
    enabled = parse({**raw, "use_sliding_window": True, "max_window_layers": 1})
    assert enabled.max_model_len == LLAMA["max_position_embeddings"]
    layers = range(enabled.num_layers)
    assert [enabled.layer_window(i) for i in layers] == [None] + [128] * (enabled.num_layers - 1)
    assert not enabled.all_layers_windowed
    typed = parse(
        {
            **raw,
            "use_sliding_window": True,
            "layer_types": ["sliding_attention", "full_attention"] * (enabled.num_layers // 2),
        }
    )
    assert typed.window_layers == tuple(range(0, enabled.num_layers, 2))


@pytest.mark.parametrize(
    ("change", "error", "named"),
    [
        ({"architectures": ["BertModel"]}, UnsupportedArchitectureError, "MistralForCausalLM"),
        ({"hidden_act": "gelu"}, UnsupportedArchitectureError, "hidden_act"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            UnsupportedArchitectureError,
            "yarn",
        ),
        ({"vocab_size": None}, ConfigError, "vocab_size"),
        ({"num_key_value_heads": 3}, ConfigError, "num_key_value_heads"),
    ],
)
def test_bad_configs_name_the_problem(change: dict[str, Any], error: type, named: str) -> None:
    with pytest.raises(error, match=named):
        parse({**LLAMA, **change})


@pytest.mark.parametrize("preset", list(PRESETS))
def test_weight_map_fills_every_parameter_exactly(saved_config, preset: str) -> None:
    cfg = saved_config(preset)
    model = CausalLM(cfg, torch_backend(), device="meta")
    params = dict(model.named_parameters())
    filled = {name: 0 for name in params}
    for slots in build_weight_map(cfg).expected.values():
        for slot in slots:
            assert slot.param in params, slot
            filled[slot.param] += torch.Size(slot.shape).numel()
    assert filled == {name: p.numel() for name, p in params.items()}
