"""The few numbers of a model that decide its memory: layers, KV heads, head size, parameters.

``ModelShape`` is what the sizer reads from a preset, a ``config.json`` or a built-in model, and
the one place the KV-per-token formula lives:

- grouped-query / multi-head attention: ``2 (K and V) x layers x kv_heads x head_dim x bytes``;
- multi-head latent attention (DeepSeek-V2/V3): one compressed latent per token and layer,
  ``layers x (kv_lora_rank + qk_rope_head_dim) x bytes`` (no factor 2: K and V are both
  re-expanded from the same latent).

Under tensor parallelism each GPU holds ``ceil(kv_heads / tp)`` KV heads (a head is never split;
with ``tp > kv_heads`` heads are replicated); an MLA latent is replicated on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import ConfigError
from core.kv_layout import QUANTIZED_KV_SCALE_BYTES

# Bytes per element. int4 is only meaningful for weights (packed, ignoring scales).
_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}
KV_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")
WEIGHT_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")


def canonical_dtype(name: str, *, allowed: tuple[str, ...], param: str) -> str:
    """Normalise a dtype name (``bfloat16`` -> ``bf16``); ConfigError naming ``allowed`` if bad."""
    key = name.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in allowed:
        raise ConfigError(
            f"unknown {param} {name!r}; choose one of: {', '.join(allowed)}", param=param
        )
    return key


def dtype_bytes(name: str) -> float:
    """Bytes per element of a canonical dtype name (see ``canonical_dtype``)."""
    return _DTYPE_BYTES[name]


@dataclass(frozen=True)
class ModelShape:
    """The memory-relevant architecture of one model (all counts per model, not per GPU)."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: int
    num_active_params: int
    max_context_tokens: int
    # Per-layer latent width for MLA (kv_lora_rank + qk_rope_head_dim); None for GQA/MHA.
    mla_latent_dim: int | None = None
    # Canonical dtype the checkpoint ships in ("auto" weight dtype resolves to it).
    default_dtype: str = "bf16"
    source: str = "preset"

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one latent vector per token and layer)."""
        return self.mla_latent_dim is not None

    @property
    def gqa_ratio(self) -> float:
        """Query heads per KV head (1 for MHA; meaningless for MLA, reported as heads/1)."""
        return self.num_attention_heads / self.num_kv_heads

    def kv_elements_per_token(self, tensor_parallel_size: int = 1) -> int:
        """KV-cache elements one token occupies on one GPU of a ``tensor_parallel_size`` group."""
        if self.mla_latent_dim is not None:
            return self.num_layers * self.mla_latent_dim
        kv_heads_per_gpu = math.ceil(self.num_kv_heads / tensor_parallel_size)
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str, tensor_parallel_size: int = 1) -> int:
        """KV-cache bytes per token on one GPU (the whole model when ``tensor_parallel_size=1``);
        an 8-bit cache adds the engine's float16 scale per head row (per latent row for MLA)."""
        elements = self.kv_elements_per_token(tensor_parallel_size)
        num_bytes = math.ceil(elements * dtype_bytes(kv_dtype))
        if kv_dtype in ("fp8", "int8"):
            head_dim = self.mla_latent_dim or self.head_dim
            num_bytes += elements // head_dim * QUANTIZED_KV_SCALE_BYTES
        return num_bytes

    def mha_kv_bytes_per_token(self, kv_dtype: str) -> int:
        """What one token would cost with one KV head per query head (the no-GQA baseline)."""
        elements = 2 * self.num_layers * self.num_attention_heads * self.head_dim
        return math.ceil(elements * dtype_bytes(kv_dtype))

    def weight_bytes(self, weight_dtype: str) -> int:
        """Bytes of all weights at ``weight_dtype`` (no quantization scales, no activations)."""
        return math.ceil(self.num_params * dtype_bytes(weight_dtype))
