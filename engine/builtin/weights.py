"""Deterministic random weights for the built-in models, under HF's exact tensor names.

Each tensor is drawn from its own CPU ``torch.Generator`` seeded from (model seed, tensor name),
as integers, and turned into a uniform float32 with the wanted standard deviation by correctly
rounded IEEE arithmetic only (no transcendental functions, whose last bits vary across CPUs and
libms), so the safetensors bytes are identical on every machine.

The scales differ from HF's init on purpose so that greedy decoding is not degenerate: token
embeddings have unit scale (the token identity survives the residual stream), projections are
large enough that attention and the MLPs/experts change the logits visibly, the LM head spreads
the logits, and norm weights and biases are not all ones/zeros (a loader that drops them shows).
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from engine.builtin.specs import BuiltinSpec

_UNIFORM_BITS = 23
EMBED_STD = 1.0
PROJ_STD = 0.08
ROUTER_STD = 0.1
LM_HEAD_STD = 0.12
_STORED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
NORM_STD = 0.05
BIAS_STD = 0.05


def uniform_tensor(
    shape: tuple[int, ...], std: float, seed: int, mean: float = 0.0
) -> torch.Tensor:
    """A float32 tensor, uniform around ``mean`` with standard deviation ``std``; bit-exact.

    Integers k in [0, 2^23) become ``(k - (2^22 - 0.5)) * (half_width / 2^22)``: the
    subtraction is exact in float32 (24 significant bits), then one correctly rounded multiply
    (and add, for a non-zero mean) gives the same bits on every IEEE machine.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    ints = torch.randint(0, 2**_UNIFORM_BITS, shape, generator=generator, dtype=torch.int64)
    half_range = float(2 ** (_UNIFORM_BITS - 1))
    values = ints.to(torch.float32).sub_(half_range - 0.5)  # exact, in (-2^22, 2^22)
    values.mul_(std * math.sqrt(3.0) / half_range)
    return values.add_(mean) if mean else values


def _tensor_seed(model_seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{model_seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def build_weights(spec: BuiltinSpec) -> dict[str, torch.Tensor]:
    """All tensors of ``spec``'s checkpoint, keyed by HF name, in its ``torch_dtype`` (the
    float32 draws rounded to nearest, so half-precision bytes are deterministic too).

    Tensors are drawn on a thread per core (each from its own generator, so the bytes do not
    depend on the order): a generator's draws are sequential, and the GPU MoE built-in's 5B
    parameters took ~150 s on one thread."""
    dtype = _STORED_DTYPES[spec.config.get("torch_dtype", "float32")]
    shapes = tensor_shapes(spec.config)

    def draw(name: str) -> torch.Tensor:
        return _init_tensor(spec.seed, name, shapes[name]).to(dtype)

    with ThreadPoolExecutor(max_workers=torch.get_num_threads()) as pool:
        return dict(zip(shapes, pool.map(draw, shapes), strict=True))


def _init_tensor(model_seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    seed = _tensor_seed(model_seed, name)
    if name.endswith("norm.weight"):
        return uniform_tensor(shape, NORM_STD, seed, mean=1.0)
    if name.endswith(".bias"):
        return uniform_tensor(shape, BIAS_STD, seed)
    if name == "model.embed_tokens.weight":
        return uniform_tensor(shape, EMBED_STD, seed)
    if name == "lm_head.weight":
        return uniform_tensor(shape, LM_HEAD_STD, seed)
    if name.endswith("mlp.gate.weight"):
        return uniform_tensor(shape, ROUTER_STD, seed)
    return uniform_tensor(shape, PROJ_STD, seed)


def num_parameters(config: dict[str, Any]) -> int:
    """Parameters of a built-in checkpoint, from its config alone (no weights are built)."""
    return sum(math.prod(shape) for shape in tensor_shapes(config).values())


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor's HF name and shape for a built-in ``config``."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer_idx in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer_idx}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        shapes.update(_attention_shapes(config, f"{prefix}.self_attn"))
        if config.get("num_experts"):
            shapes.update(_moe_shapes(config, f"{prefix}.mlp"))
        else:
            shapes.update(_mlp_shapes(hidden, config["intermediate_size"], f"{prefix}.mlp"))
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _attention_shapes(config: dict[str, Any], prefix: str) -> dict[str, tuple[int, ...]]:
    hidden = config["hidden_size"]
    num_heads, num_kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // num_heads
    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        f"{prefix}.q_proj.weight": (q_dim, hidden),
        f"{prefix}.k_proj.weight": (kv_dim, hidden),
        f"{prefix}.v_proj.weight": (kv_dim, hidden),
        f"{prefix}.o_proj.weight": (hidden, q_dim),
    }
    # Qwen2-family attention has q/k/v biases; Llama's ``attention_bias`` also covers o_proj.
    biased = {"q_proj": q_dim, "k_proj": kv_dim, "v_proj": kv_dim}
    if config["model_type"] in ("qwen3", "qwen3_moe"):  # per-head RMSNorm of q and k
        shapes[f"{prefix}.q_norm.weight"] = (head_dim,)
        shapes[f"{prefix}.k_norm.weight"] = (head_dim,)
    if config["model_type"] == "qwen2_moe":
        shapes.update({f"{prefix}.{proj}.bias": (dim,) for proj, dim in biased.items()})
    elif config.get("attention_bias", False):
        shapes.update({f"{prefix}.{proj}.bias": (dim,) for proj, dim in biased.items()})
        shapes[f"{prefix}.o_proj.bias"] = (hidden,)
    return shapes


def _mlp_shapes(hidden: int, intermediate: int, prefix: str) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.gate_proj.weight": (intermediate, hidden),
        f"{prefix}.up_proj.weight": (intermediate, hidden),
        f"{prefix}.down_proj.weight": (hidden, intermediate),
    }


def _moe_shapes(config: dict[str, Any], prefix: str) -> dict[str, tuple[int, ...]]:
    hidden, num_experts = config["hidden_size"], config["num_experts"]
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}.gate.weight": (num_experts, hidden)}
    for expert_id in range(num_experts):
        expert_prefix = f"{prefix}.experts.{expert_id}"
        shapes.update(_mlp_shapes(hidden, config["moe_intermediate_size"], expert_prefix))
    shared = config.get("shared_expert_intermediate_size")
    if shared:  # Qwen2-MoE; Qwen3-MoE has none
        shapes.update(_mlp_shapes(hidden, shared, f"{prefix}.shared_expert"))
        shapes[f"{prefix}.shared_expert_gate.weight"] = (1, hidden)
    return shapes
