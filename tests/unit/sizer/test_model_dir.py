"""Model shapes from config.json, safetensors headers, built-in caches and presets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.errors import ModelNotFoundError
from sizer.model_dir import load_model_shape, shape_from_config
from sizer.model_presets import find_preset, get_preset, preset_names

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
}
MIXTRAL = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def test_config_json_matches_the_presets() -> None:
    qwen = shape_from_config(QWEN25_7B, "qwen")
    assert qwen.kv_bytes_per_token("bf16") == get_preset("Qwen2.5-7B").kv_bytes_per_token("bf16")
    assert qwen.num_params == pytest.approx(7.62e9, rel=0.01)
    assert qwen.default_dtype == "bf16" and qwen.max_context_tokens == 131072
    deepseek = shape_from_config(DEEPSEEK_V3, "ds")
    assert deepseek.mla_latent_dim == 576
    assert deepseek.kv_bytes_per_token("bf16") == 70_272
    assert deepseek.num_params == pytest.approx(671e9, rel=0.01)
    assert deepseek.num_active_params == pytest.approx(37e9, rel=0.03)
    mixtral = shape_from_config(MIXTRAL, "mixtral")
    assert mixtral.num_params == pytest.approx(46.7e9, rel=0.01)
    assert mixtral.num_active_params == pytest.approx(12.9e9, rel=0.01)


def test_model_dir_counts_safetensors_parameters(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    tiny = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "torch_dtype": "float32",
    }
    (tmp_path / "config.json").write_text(json.dumps(tiny))
    estimated = load_model_shape(str(tmp_path)).num_params
    save_file(
        {"a": np.zeros((10, 20), np.float32), "b": np.zeros(7, np.float32)},
        str(tmp_path / "model-00001.safetensors"),
    )
    save_file({"c": np.zeros((3, 3, 3), np.float16)}, str(tmp_path / "model-00002.safetensors"))
    shape = load_model_shape(str(tmp_path / "config.json"))
    assert shape.num_params == 200 + 7 + 27 != estimated
    assert shape.source == "safetensors"
    assert shape.default_dtype == "fp32"
    assert shape.kv_bytes_per_token("fp32") == 2 * 2 * 2 * 16 * 4


def test_builtin_models_come_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="pdserve generate --model builtin:tiny-x"):
        load_model_shape("builtin:tiny-x")
    model_dir = tmp_path / "models" / "tiny-x"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps({**MIXTRAL, "num_hidden_layers": 4}))
    assert load_model_shape("builtin:tiny-x").num_layers == 4


def test_preset_lookup_and_errors(tmp_path: Path) -> None:
    assert find_preset("Qwen/Qwen2.5-7B-Instruct") is get_preset("qwen2.5-7b")
    assert find_preset("meta-llama/Llama-3.1-70B-Instruct") is get_preset("Llama-3.1-70B")
    expected = {"Qwen2.5-7B", "Qwen2.5-72B", "Llama-3.1-8B", "Llama-3.1-70B", "Mistral-7B"}
    assert expected | {"DeepSeek-V3"} <= set(preset_names())
    with pytest.raises(ModelNotFoundError, match=r"unknown model.*Qwen2\.5-7B, .*DeepSeek-V3"):
        load_model_shape("gpt-5")
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        load_model_shape(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFoundError, match=r"has no config\.json"):
        load_model_shape(str(tmp_path))
