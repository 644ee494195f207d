"""A GGUF file's metadata as the HF ``config.json`` body of the same model.

The engine parses every checkpoint's shape through :meth:`ModelArchConfig.from_hf_dict`, so a
GGUF file is described in those terms: ``{arch}.block_count`` is ``num_hidden_layers``,
``{arch}.rope.freq_base`` is ``rope_theta``, and so on. What the metadata leaves implicit comes
from the tensors, as llama.cpp itself decides it: tied embeddings when there is no
``output.weight``, attention biases when ``attn_q.bias`` exists, the dense layers of a MoE model
where a block has no stacked experts, widths the metadata omits from the tensors' shapes.
"""

from __future__ import annotations

from typing import Any

from core.errors import UnsupportedArchitectureError
from engine.gguf.file import ARCHITECTURES, GGUFFile

_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
LLAMA_CPP_ROPE_THETA = 10000.0  # llama.cpp's default when rope.freq_base is absent
_RENORMALIZES_TOP_K = {"qwen3moe": True, "qwen2moe": False}  # as llama.cpp routes each


def hf_config(file: GGUFFile) -> dict[str, Any]:
    """The ``config.json`` body describing ``file``'s model."""
    num_layers = int(_need(file, "block_count"))
    hidden = int(_need(file, "embedding_length"))
    num_heads = int(_need(file, "attention.head_count"))
    head_dim = int(file.arch_field("attention.key_length") or hidden // num_heads)
    _check_rotary(file, head_dim)
    num_experts = int(file.arch_field("expert_count") or 0)
    architecture = ARCHITECTURES[file.architecture]
    if file.architecture == "llama" and num_experts:
        architecture = "MixtralForCausalLM"
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": _MODEL_TYPES[architecture],
        "hidden_act": "silu",
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(file.arch_field("attention.head_count_kv") or num_heads),
        "head_dim": head_dim,
        "intermediate_size": _intermediate_size(file),
        "vocab_size": _rows(file, "token_embd.weight"),
        "max_position_embeddings": int(_need(file, "context_length")),
        "rms_norm_eps": float(_need(file, "attention.layer_norm_rms_epsilon")),
        "rope_theta": float(file.arch_field("rope.freq_base") or LLAMA_CPP_ROPE_THETA),
        "rope_scaling": _rope_scaling(file),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "attention_bias": "blk.0.attn_q.bias" in file.tensors,
        "bos_token_id": file.field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": file.field("tokenizer.ggml.eos_token_id"),
    }
    if num_experts:
        config.update(_moe_fields(file, num_experts, num_layers))
    return config


def _need(file: GGUFFile, key: str) -> Any:
    value = file.arch_field(key)
    if value is None:
        raise UnsupportedArchitectureError(
            f"GGUF file {str(file.path)!r} lacks metadata {file.architecture}.{key}",
            param=f"{file.architecture}.{key}",
        )
    return value


def _rows(file: GGUFFile, name: str) -> int:
    """Rows of an HF-order matrix (GGUF lists dimensions innermost first)."""
    return int(file.tensors[name].shape[-1])


def _check_rotary(file: GGUFFile, head_dim: int) -> None:
    rotary = file.arch_field("rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        raise UnsupportedArchitectureError(
            f"GGUF file {str(file.path)!r} rotates {rotary} of {head_dim} head dimensions; "
            "partial rotary embeddings are not supported",
            param=f"{file.architecture}.rope.dimension_count",
        )


def _intermediate_size(file: GGUFFile) -> int:
    """``feed_forward_length``, else a dense MLP's width, else (every layer sparse) unused."""
    width = file.arch_field("feed_forward_length")
    if width:
        return int(width)
    dense = next((n for n in file.tensors if n.endswith(".ffn_gate.weight")), None)
    return _rows(file, dense) if dense else 0


def _rope_scaling(file: GGUFFile) -> dict[str, Any] | None:
    kind = file.arch_field("rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {
        "rope_type": str(kind),
        "factor": float(file.arch_field("rope.scaling.factor") or 1.0),
    }
    original = file.arch_field("rope.scaling.original_context_length")
    if original:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _moe_fields(file: GGUFFile, num_experts: int, num_layers: int) -> dict[str, Any]:
    sparse = [i for i in range(num_layers) if f"blk.{i}.ffn_gate_exps.weight" in file.tensors]
    expert_width = file.arch_field("expert_feed_forward_length")
    if not expert_width and sparse:
        expert_width = int(file.tensors[f"blk.{sparse[0]}.ffn_gate_exps.weight"].shape[1])
    fields: dict[str, Any] = {
        "num_experts_per_tok": int(_need(file, "expert_used_count")),
        "mlp_only_layers": [i for i in range(num_layers) if i not in sparse],
        "decoder_sparse_step": 1,
    }
    if file.architecture == "llama":  # Mixtral: experts as wide as feed_forward_length
        return {**fields, "num_local_experts": num_experts}
    fields.update(
        num_experts=num_experts,
        moe_intermediate_size=int(expert_width or 0),
        norm_topk_prob=_RENORMALIZES_TOP_K[file.architecture],
    )
    shared = next(
        (t for n, t in file.tensors.items() if n.endswith(".ffn_gate_shexp.weight")), None
    )
    if shared is not None:
        width = file.arch_field("expert_shared_feed_forward_length") or shared.shape[-1]
        fields["shared_expert_intermediate_size"] = int(width)
    return fields
