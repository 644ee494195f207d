"""Which linears of a model an adapter may target, by PEFT's module names, and how to give
them LoRA slots.

PEFT names HF's separate projections (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``,
``gate_proj``, ``up_proj``, ``down_proj``); pdserve fuses q/k/v into ``qkv_proj`` and gate/up
into ``gate_up_proj``, so each PEFT module is a (linear, segment) pair here. The MLP modules exist
only in dense layers: an MoE layer's experts take no adapter (vLLM's default too).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.decoder import CausalLM, DecoderLayer
from engine.models.layers import GatedMLP, Linear
from engine.models.lora.batch import LoRAStepState
from engine.models.lora.slots import LoRASlots

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODULES = ATTENTION_MODULES + MLP_MODULES
"""Every PEFT target module name pdserve can apply."""

_SEGMENT_OF = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}


@dataclass(frozen=True)
class LoRATarget:
    """One PEFT module of one layer: its fused linear, segment and the shapes A and B take."""

    layer_idx: int
    module: str  # PEFT's name, e.g. "q_proj"
    linear: str  # this model's linear, e.g. "qkv_proj"
    segment: int
    in_features: int
    out_features: int


def _linears(model: CausalLM, layer_idx: int) -> dict[str, Linear]:
    layer = model.layers[layer_idx]
    assert isinstance(layer, DecoderLayer)  # for mypy: a ModuleList holds Modules
    found = {"qkv_proj": layer.self_attn.qkv_proj, "o_proj": layer.self_attn.o_proj}
    if isinstance(layer.mlp, GatedMLP):
        found["gate_up_proj"] = layer.mlp.gate_up_proj
        found["down_proj"] = layer.mlp.down_proj
    return found


def _segments(model: CausalLM, linear: str, out_features: int) -> list[tuple[int, int]]:
    """Output-column ranges of the projections ``linear`` fuses."""
    if linear == "qkv_proj":
        head_dim = model.config.head_dim
        q = model.config.num_heads * head_dim
        kv = model.config.num_kv_heads * head_dim
        return [(0, q), (q, q + kv), (q + kv, q + 2 * kv)]
    if linear == "gate_up_proj":
        half = out_features // 2
        return [(0, half), (half, out_features)]
    return [(0, out_features)]


def lora_targets(model: CausalLM) -> dict[tuple[int, str], LoRATarget]:
    """Every (layer, PEFT module) the model can apply an adapter to."""
    if model.tp is not None:
        raise ValueError("LoRA adapters need an unsharded model (tensor_parallel_size 1)")
    targets: dict[tuple[int, str], LoRATarget] = {}
    for layer_idx in range(len(model.layers)):
        linears = _linears(model, layer_idx)
        for module, (linear_name, segment) in _SEGMENT_OF.items():
            linear = linears.get(linear_name)
            if linear is None:
                continue
            out_features, in_features = linear.weight.shape
            first, end = _segments(model, linear_name, out_features)[segment]
            targets[(layer_idx, module)] = LoRATarget(
                layer_idx, module, linear_name, segment, in_features, end - first
            )
    return targets


def attach_lora_slots(
    model: CausalLM, *, num_slots: int, max_rank: int, step: LoRAStepState
) -> dict[tuple[int, str], LoRASlots]:
    """Give every targetable linear ``num_slots`` zeroed adapter slots of rank ``max_rank``
    reading ``step``; returns them by (layer, linear name)."""
    lora_targets(model)  # refuses a sharded model
    device = model.embed_tokens.weight.device
    attached: dict[tuple[int, str], LoRASlots] = {}
    for layer_idx in range(len(model.layers)):
        for name, linear in _linears(model, layer_idx).items():
            out_features, in_features = linear.weight.shape
            slots = LoRASlots(
                in_features,
                _segments(model, name, out_features),
                num_slots=num_slots,
                max_rank=max_rank,
                step=step,
                fused=model.kernels.fused,
                dtype=model.dtype,
                device=device,
            )
            linear.lora = slots
            attached[(layer_idx, name)] = slots
    return attached
