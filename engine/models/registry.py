"""Supported architectures: what distinguishes each HF ``architectures`` entry from the others.

Every supported family is a pre-norm decoder (RMSNorm, RoPE, SiLU-gated MLP); an :class:`ArchSpec`
records only what differs: the ``config.json`` defaults of the HF config class (used when a key
is absent), the attention bias and q/k-norm rules, the sliding-window rule, and for MoE families
the :class:`MoESpec` (routing, shared expert, config keys and checkpoint names of the experts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class MoESpec:
    """How one MoE family names, routes and stores its experts."""

    num_experts_keys: tuple[str, ...]  # config keys for the expert count, first present wins
    expert_intermediate_key: str  # config key of each expert's intermediate size
    always_renormalize: bool  # Mixtral: top-k weights always sum to 1; Qwen: norm_topk_prob
    has_shared_expert: bool  # Qwen2-MoE: a dense shared expert behind a sigmoid gate
    honours_sparse_step: bool  # decoder_sparse_step / mlp_only_layers select the MoE layers
    checkpoint_blocks: tuple[str, ...]  # per-layer module names holding gate + experts
    expert_weight_names: tuple[str, str, str]  # per-expert (gate, up, down) names in checkpoints


@dataclass(frozen=True)
class ArchSpec:
    """The traits of one supported ``architectures`` entry."""

    architecture: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    qkv_bias_key: str | None = "attention_bias"  # None: the bias is fixed at qkv_bias_default
    qkv_bias_default: bool = False
    o_bias_follows_qkv: bool = True  # Llama/Qwen3 put attention_bias on o_proj too
    qk_norm: bool = False
    sliding_window_needs_flag: bool = False  # Qwen: only when use_sliding_window is true
    moe: MoESpec | None = None


_COMMON = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0}

_QWEN_MOE_BLOCKS = ("mlp",)
_QWEN_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")

_SPECS: tuple[ArchSpec, ...] = (
    ArchSpec("LlamaForCausalLM", {**_COMMON, "max_position_embeddings": 2048}),
    ArchSpec(
        "MistralForCausalLM",
        {**_COMMON, "max_position_embeddings": 131072, "sliding_window": 4096},
        qkv_bias_key=None,
    ),
    ArchSpec(
        "Qwen2ForCausalLM",
        {**_COMMON, "max_position_embeddings": 32768},
        qkv_bias_key=None,
        qkv_bias_default=True,
        o_bias_follows_qkv=False,
        sliding_window_needs_flag=True,
    ),
    ArchSpec(
        "MixtralForCausalLM",
        {**_COMMON, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 131072},
        qkv_bias_key=None,
        moe=MoESpec(
            num_experts_keys=("num_local_experts", "num_experts"),
            expert_intermediate_key="intermediate_size",
            always_renormalize=True,
            has_shared_expert=False,
            honours_sparse_step=False,
            checkpoint_blocks=("block_sparse_moe", "mlp"),
            expert_weight_names=("w1", "w3", "w2"),
        ),
    ),
    ArchSpec(
        "Qwen2MoeForCausalLM",
        {**_COMMON, "max_position_embeddings": 32768},
        qkv_bias_key="qkv_bias",
        qkv_bias_default=True,
        o_bias_follows_qkv=False,
        sliding_window_needs_flag=True,
        moe=MoESpec(
            num_experts_keys=("num_experts", "num_local_experts"),
            expert_intermediate_key="moe_intermediate_size",
            always_renormalize=False,
            has_shared_expert=True,
            honours_sparse_step=True,
            checkpoint_blocks=_QWEN_MOE_BLOCKS,
            expert_weight_names=_QWEN_EXPERT_NAMES,
        ),
    ),
    ArchSpec(
        "Qwen3MoeForCausalLM",
        {**_COMMON, "max_position_embeddings": 32768},
        qk_norm=True,
        sliding_window_needs_flag=True,
        moe=MoESpec(
            num_experts_keys=("num_experts", "num_local_experts"),
            expert_intermediate_key="moe_intermediate_size",
            always_renormalize=False,
            has_shared_expert=False,
            honours_sparse_step=True,
            checkpoint_blocks=_QWEN_MOE_BLOCKS,
            expert_weight_names=_QWEN_EXPERT_NAMES,
        ),
    ),
)

ARCH_SPECS: Mapping[str, ArchSpec] = {spec.architecture: spec for spec in _SPECS}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(ARCH_SPECS)


def get_arch_spec(architecture: str) -> ArchSpec:
    """The spec of ``architecture``; :class:`UnsupportedArchitectureError` lists the supported."""
    spec = ARCH_SPECS.get(architecture)
    if spec is None:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported; supported: "
            + ", ".join(SUPPORTED_ARCHITECTURES),
            param="architectures",
        )
    return spec
