"""The built-in models: their HF ``config.json`` bodies and weight seeds.

The two tiny ones are small enough to decode on two CPU cores yet keep the traits that matter to
the engine: four layers, grouped-query attention (8 query heads over 2 KV heads, head_dim 32), a
64K-token position range with a large RoPE base, and for the MoE 8 routed experts with top-2
routing plus a sigmoid-gated shared expert. ``mid-moe`` is the same MoE six times larger per
token (8 layers, 16 experts, wider experts): the large model beside tiny-llama in the tiered-
routing benchmark on CPU (not written by tests). ``llama-1b`` is for GPU measurements: a Llama
3.2 1B-shaped model (hidden 2048, 16 layers, GQA 32:8, head_dim 64, MLP 8192) with a 32000-token
vocabulary, about 1.1B parameters stored in bf16 (2.2 GB, written in a minute or so on first
use; never on a CPU test path). ``gpu-moe`` loads an H100 as MoE models do: Qwen3-MoE-shaped
(16 layers, hidden 2048, GQA 32:4 with q/k norms, 64 experts of width 768, top-8 routing, no
shared expert, vocabulary 32000), about 5.1B parameters of which 0.85B are active per token,
10 GB in bf16 (GPU rounds only). The configs use the hub's original key names (``rope_theta``,
``torch_dtype``), which every loader understands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.builtin.byte_tokenizer import BOS_TOKEN_ID, GENERATION_EOS_TOKEN_IDS, PAD_TOKEN_ID

# NOTE: bump when anything written to a built-in checkpoint changes (configs, weights, tokenizer
# files): caches holding an older version are rewritten on next use.
FORMAT_VERSION = 1

VOCAB_SIZE = 320
HIDDEN_SIZE = 256
NUM_LAYERS = 4
NUM_HEADS = 8
NUM_KV_HEADS = 2
HEAD_DIM = 32
MAX_POSITION_EMBEDDINGS = 65536
ROPE_THETA = 1_000_000.0


@dataclass(frozen=True)
class BuiltinSpec:
    """One built-in checkpoint: its name (after ``builtin:``), config and weight seed."""

    name: str
    config: dict[str, Any]
    seed: int
    tiny: bool = True  # small enough to write and run in CPU tests


def _common_config() -> dict[str, Any]:
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": list(GENERATION_EOS_TOKEN_IDS),
        "pad_token_id": PAD_TOKEN_ID,
        "torch_dtype": "float32",
    }


def _tiny_llama() -> BuiltinSpec:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_common_config(),
        "head_dim": HEAD_DIM,
        "intermediate_size": 512,
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "pretraining_tp": 1,
    }
    return BuiltinSpec(name="tiny-llama", config=config, seed=1234)


def _tiny_moe() -> BuiltinSpec:
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        **_common_config(),
        "intermediate_size": 512,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": NUM_LAYERS,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 512,
        "norm_topk_prob": False,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    }
    return BuiltinSpec(name="tiny-moe", config=config, seed=5678)


def _mid_moe() -> BuiltinSpec:
    """tiny-moe's architecture, six times its active parameters per token: the large model
    of a tiered-routing fleet on CPU (8 layers, 16 experts of which 2 are active)."""
    tiny = _tiny_moe().config
    config = {
        **tiny,
        "num_hidden_layers": 8,
        "max_window_layers": 8,
        "num_experts": 16,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 1024,
    }
    return BuiltinSpec(name="mid-moe", config=config, seed=8765, tiny=False)


def _llama_1b() -> BuiltinSpec:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_common_config(),
        "vocab_size": 32000,
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 8192,
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "torch_dtype": "bfloat16",
    }
    return BuiltinSpec(name="llama-1b", config=config, seed=4321, tiny=False)


def _gpu_moe() -> BuiltinSpec:
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **_common_config(),
        "vocab_size": 32000,
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "intermediate_size": 6144,  # dense MLP width; unused (every layer is sparse)
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 16,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "torch_dtype": "bfloat16",
    }
    return BuiltinSpec(name="gpu-moe", config=config, seed=2468, tiny=False)


BUILTIN_SPECS: dict[str, BuiltinSpec] = {
    s.name: s for s in (_tiny_llama(), _tiny_moe(), _mid_moe(), _llama_1b(), _gpu_moe())
}
#: The built-ins CPU tests may write and run.
TINY_SPECS: dict[str, BuiltinSpec] = {n: s for n, s in BUILTIN_SPECS.items() if s.tiny}
