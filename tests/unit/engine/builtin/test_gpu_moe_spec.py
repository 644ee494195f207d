"""The GPU-sized MoE built-in: its shape and size, from the spec alone (10 GB of weights are
never written here), and a scaled-down copy of it that loads and runs like HF's Qwen3-MoE."""

from __future__ import annotations

from pathlib import Path

import torch

from core.sampling import SamplingParams
from engine import LLM
from engine.builtin.resolve import ensure_builtin
from engine.builtin.specs import BUILTIN_SPECS, TINY_SPECS, BuiltinSpec
from engine.builtin.weights import num_parameters, tensor_shapes
from engine.models import ModelArchConfig

SPEC = BUILTIN_SPECS["gpu-moe"]


def test_gpu_moe_is_listed_but_never_tiny() -> None:
    assert not SPEC.tiny and "gpu-moe" not in TINY_SPECS
    assert SPEC.config["torch_dtype"] == "bfloat16"


def test_gpu_moe_shape() -> None:
    arch = ModelArchConfig.from_hf_dict(SPEC.config)
    assert (arch.hidden_size, arch.num_layers, arch.vocab_size) == (2048, 16, 32000)
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim) == (32, 4, 64)
    assert arch.is_moe and arch.qk_norm and not arch.tie_word_embeddings
    assert (arch.num_experts, arch.top_k, arch.moe_intermediate_size) == (64, 8, 768)
    assert all(arch.is_moe_layer(i) for i in range(16))


def test_gpu_moe_parameter_count() -> None:
    hidden, layers, vocab, experts, inter, head_dim = 2048, 16, 32000, 64, 768, 64
    q_dim, kv_dim = 32 * head_dim, 4 * head_dim
    attention = 2 * hidden * q_dim + 2 * hidden * kv_dim + 2 * head_dim  # q, o, k, v, q/k norms
    expert = 3 * hidden * inter  # gate, up, down
    per_layer = attention + experts * hidden + experts * expert + 2 * hidden  # + router, norms
    total = 2 * vocab * hidden + layers * per_layer + hidden
    assert num_parameters(SPEC.config) == total
    assert 5.0e9 < total < 5.2e9
    active = total - layers * (experts - 8) * expert - (vocab - 1) * hidden  # 8 experts, 1 row
    assert 0.8e9 < active < 0.9e9
    per_layer_tensors = 4 + 2 + 1 + 3 * experts + 2  # q/k/v/o, q/k norm, router, experts, norms
    assert len(tensor_shapes(SPEC.config)) == 1 + layers * per_layer_tensors + 2


def test_a_scaled_down_copy_loads_in_hf_cleanly_and_matches_our_greedy_tokens(
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    small = {
        **SPEC.config,
        "vocab_size": 320,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "max_window_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "torch_dtype": "float32",
    }
    spec = BuiltinSpec(name="gpu-moe-small", config=small, seed=SPEC.seed, tiny=False)
    ensure_builtin(spec, tmp_path)
    model_dir = tmp_path / spec.name
    hf, info = AutoModelForCausalLM.from_pretrained(str(model_dir), output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    prompt = [5, 17, 99, 203, 42, 7]
    with torch.inference_mode():
        want = hf.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0
        )[0, len(prompt) :].tolist()
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = LLM(str(model_dir)).generate(prompt_token_ids=[prompt], sampling_params=params)
    assert list(got[0].outputs[0].token_ids) == want
