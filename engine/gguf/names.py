"""GGUF tensor names (llama.cpp's ``blk.N.attn_q.weight``) -> the HF names the weight map uses.

The GGUF names are the standard set of ggml's docs (``gguf.MODEL_TENSOR``) for the families
pdserve runs. A stacked expert tensor (``blk.N.ffn_gate_exps.weight``, ``[E, rows, cols]``)
stands for one HF tensor per expert, so the loader reads — and dequantizes — only the experts a
rank owns. A name outside the table maps to nothing and is reported as unexpected.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.config import ModelArchConfig

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# blk.N.<key> -> model.layers.N.<value>
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
ROUTER = "ffn_gate_inp"
# blk.N.<key> -> the index into the family's (gate, up, down) expert weight names
EXPERT_TENSORS = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}
STACKED_EXPERT_SUFFIX = "_exps"
# llama.cpp permutes these rows for the ``llama`` architecture (its RoPE pairs neighbours)
PERMUTED_KEYS = {"attn_q": "heads", "attn_k": "kv_heads"}


@dataclass(frozen=True)
class TensorRef:
    """Where an HF tensor lies in a GGUF file: a tensor, or one expert of a stacked one."""

    gguf_name: str
    expert: int | None = None

    @property
    def key(self) -> str:
        """The name without ``blk.N.`` and suffix: ``attn_q`` for ``blk.3.attn_q.weight``."""
        stem = self.gguf_name.rsplit(".", 1)[0]
        return stem.split(".", 2)[2] if stem.startswith("blk.") else stem


def hf_names(gguf_name: str, config: ModelArchConfig) -> dict[str, TensorRef]:
    """The HF tensors ``gguf_name`` holds (one per expert for a stacked expert tensor); empty
    for a name pdserve does not map."""
    stem, dot, suffix = gguf_name.rpartition(".")
    if not dot or suffix not in ("weight", "bias"):
        return {}
    if stem in GLOBAL_NAMES:
        return {f"{GLOBAL_NAMES[stem]}.{suffix}": TensorRef(gguf_name)}
    parts = stem.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return {}
    layer, key = f"model.layers.{parts[1]}", parts[2]
    if key in LAYER_NAMES:
        return {f"{layer}.{LAYER_NAMES[key]}.{suffix}": TensorRef(gguf_name)}
    moe = config.spec.moe
    if moe is None:
        return {}
    block = f"{layer}.{moe.checkpoint_blocks[0]}"
    if key == ROUTER:
        return {f"{block}.gate.{suffix}": TensorRef(gguf_name)}
    if key in EXPERT_TENSORS:
        weight = moe.expert_weight_names[EXPERT_TENSORS[key]]
        return {
            f"{block}.experts.{e}.{weight}.{suffix}": TensorRef(gguf_name, e)
            for e in range(config.num_experts)
        }
    return {}
