"""Parameter counts estimated from a HF ``config.json`` when no safetensors files are at hand.

Counts the matrices of a Llama/Qwen/Mistral-style decoder (attention projections, a gated MLP
of three matrices, embeddings and an untied LM head), MoE expert banks (Mixtral, Qwen-MoE,
DeepSeek) and DeepSeek's MLA projections. Norms and biases are left out (well under 0.1%).
Returns ``(total, active_per_token)``.
"""

from __future__ import annotations

from typing import Any


def _attention_params(cfg: dict[str, Any], hidden: int, heads: int, head_dim: int) -> int:
    if cfg.get("kv_lora_rank"):
        nope = int(cfg.get("qk_nope_head_dim", head_dim))
        rope = int(cfg.get("qk_rope_head_dim", 0))
        v_dim = int(cfg.get("v_head_dim", head_dim))
        kv_lora = int(cfg["kv_lora_rank"])
        q_lora = cfg.get("q_lora_rank")
        q_out = heads * (nope + rope)
        q = hidden * int(q_lora) + int(q_lora) * q_out if q_lora else hidden * q_out
        kv = hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim


def _num_experts(cfg: dict[str, Any]) -> int:
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if cfg.get(key):
            return int(cfg[key])
    return 0


def _moe_layer_count(cfg: dict[str, Any], num_layers: int) -> int:
    if "first_k_dense_replace" in cfg:
        return num_layers - int(cfg["first_k_dense_replace"])
    dense_only = len(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    return (num_layers - dense_only) // step


def _mlp_params(cfg: dict[str, Any], hidden: int, num_layers: int) -> tuple[int, int]:
    dense = 3 * hidden * int(cfg.get("intermediate_size", 4 * hidden))
    experts = _num_experts(cfg)
    if experts == 0:
        return num_layers * dense, num_layers * dense
    expert_size = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    expert = 3 * hidden * expert_size
    shared = 3 * hidden * int(cfg.get("n_shared_experts") or 0) * expert_size
    shared += 3 * hidden * int(cfg.get("shared_expert_intermediate_size") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or 2)
    moe_layers = _moe_layer_count(cfg, num_layers)
    dense_layers = num_layers - moe_layers
    router = hidden * experts
    total = dense_layers * dense + moe_layers * (experts * expert + shared + router)
    active = dense_layers * dense + moe_layers * (top_k * expert + shared + router)
    return total, active


def estimate_params(cfg: dict[str, Any]) -> tuple[int, int]:
    """(total parameters, parameters active per token) of the model ``cfg`` describes."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    num_layers = int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(cfg.get("vocab_size", 0))
    attention = num_layers * _attention_params(cfg, hidden, heads, head_dim)
    mlp_total, mlp_active = _mlp_params(cfg, hidden, num_layers)
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return attention + mlp_total + embeddings, attention + mlp_active + embeddings
