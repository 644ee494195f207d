"""The model shapes the compile gate plans launches for, as their HF ``config.json`` says.

Three shapes cover the engine's kernels: a small dense model with head_dim 64 (Llama 3.2 1B), a
large dense one with head_dim 128 (Llama 3.1 8B) and a MoE model with q/k norm and GQA 8
(Qwen3-30B-A3B). Only the fields the engine reads are given; the rest take the family defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.models import ModelArchConfig

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}

_HF_CONFIGS: dict[str, Mapping[str, Any]] = {
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rope_scaling": {
            **_LLAMA3_ROPE,
            "factor": 32.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rope_scaling": {
            **_LLAMA3_ROPE,
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
    },
}

GATE_MODELS: tuple[str, ...] = tuple(_HF_CONFIGS)


def gate_model(name: str) -> ModelArchConfig:
    """The shape of gate model ``name`` (one of :data:`GATE_MODELS`)."""
    return ModelArchConfig.from_hf_dict(_HF_CONFIGS[name])
