"""The model-shape dataclass: an HF ``config.json`` parsed into the fields the engine uses.

Both the current ``rope_parameters`` format and the older ``rope_theta`` + ``rope_scaling`` keys
are read. Keys a checkpoint omits take the HF config class's default (see ``registry``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, ModelNotFoundError, UnsupportedArchitectureError
from core.kv_layout import KVLayout
from engine.models.registry import ArchSpec, get_arch_spec

if TYPE_CHECKING:
    from engine.models.tp_shard import TPShard

CONFIG_FILE = "config.json"
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: ``linear`` (divide by factor) or ``llama3`` (banded)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelArchConfig:
    """Shape and numerics of one decoder checkpoint.

    ``sliding_window`` with ``window_layers``: those layers attend over the last
    ``sliding_window`` positions only (Mistral: every layer; Qwen2 with ``use_sliding_window``:
    the layers its ``layer_types`` / ``max_window_layers`` name), so the context is not capped at
    the window.
    """

    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None = None
    window_layers: tuple[int, ...] = ()
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})",
                param="num_key_value_heads",
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim ({self.head_dim}) must be even for RoPE", param="head_dim")
        if self.is_moe and not 0 < self.top_k <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok ({self.top_k}) must be in 1..{self.num_experts}",
                param="num_experts_per_tok",
            )

    @property
    def spec(self) -> ArchSpec:
        """The family traits of :attr:`architecture`."""
        return get_arch_spec(self.architecture)

    @property
    def is_moe(self) -> bool:
        """True when some layers route tokens to experts."""
        return self.num_experts > 0

    @property
    def max_model_len(self) -> int:
        """Longest usable context in tokens: the position limit."""
        return self.max_position_embeddings

    def layer_window(self, layer_idx: int) -> int | None:
        """Layer ``layer_idx``'s sliding window (``None``: full attention)."""
        return self.sliding_window if layer_idx in self.window_layers else None

    @property
    def all_layers_windowed(self) -> bool:
        """True when every layer slides: blocks out of the window are then never read again."""
        return self.sliding_window is not None and len(self.window_layers) == self.num_layers

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Whether decoder layer ``layer_idx`` has a MoE block (else a dense gated MLP)."""
        if not self.is_moe or layer_idx in self.mlp_only_layers:
            return False
        return (layer_idx + 1) % self.decoder_sparse_step == 0

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Shape of the block-major KV tensor (see ``core.kv_layout``) for this model."""
        return (num_blocks, self.num_layers, 2, block_size, self.num_kv_heads, self.head_dim)

    def kv_layout(
        self,
        model_id: str,
        dtype: str,
        block_size: int,
        hash_seed: int,
        scale_bytes: int = 0,
        *,
        tp: TPShard | None = None,
    ) -> KVLayout:
        """The KV fingerprint of this model for ``dtype`` (e.g. ``"float32"``) blocks, with
        ``scale_bytes`` per head row for an 8-bit cache; on a tensor-parallel rank ``tp``, of
        that rank's share of the KV heads."""
        return KVLayout(
            model_id=model_id,
            dtype=dtype,
            block_size=block_size,
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads if tp is None else tp.kv_heads(self.num_kv_heads)[1],
            head_dim=self.head_dim,
            hash_seed=hash_seed,
            scale_bytes=scale_bytes,
            tp_size=1 if tp is None else tp.size,
            tp_rank=0 if tp is None else tp.rank,
            total_kv_heads=0 if tp is None or tp.size == 1 else self.num_kv_heads,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelArchConfig:
        """Parse ``model_dir/config.json``; :class:`ModelNotFoundError` names what is missing."""
        path = Path(model_dir)
        if not path.is_dir():
            raise ModelNotFoundError(f"model directory {str(path)!r} does not exist", param="model")
        config_path = path / CONFIG_FILE
        if not config_path.is_file():
            raise ModelNotFoundError(f"{str(config_path)!r} does not exist", param=CONFIG_FILE)
        try:
            raw = json.loads(config_path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read {str(config_path)!r}: {e}", param=CONFIG_FILE) from e
        quantized = raw.get("quantization_config") if isinstance(raw, dict) else None
        if quantized is not None:
            method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
            raise ConfigError(
                f"{str(config_path)!r} is an already-quantized checkpoint (quantization_config: "
                f"{method!r}); pdserve loads full-precision weights and quantizes them itself "
                "(model.quantization: int8)",
                param="quantization_config",
            )
        return cls.from_hf_dict(raw)

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> ModelArchConfig:
        """Parse the dict of an HF ``config.json``."""
        archs = raw.get("architectures") or []
        if len(archs) != 1:
            raise UnsupportedArchitectureError(
                f"config.json must name exactly one architecture, got {archs!r}",
                param="architectures",
            )
        spec = get_arch_spec(archs[0])
        cfg = _Reader(raw, spec)
        if cfg.get("hidden_act") != "silu" or cfg.get("mlp_bias"):
            raise UnsupportedArchitectureError(
                f"{spec.architecture} with hidden_act={cfg.get('hidden_act')!r}, "
                f"mlp_bias={cfg.get('mlp_bias', False)!r} is not supported (silu, no bias)",
                param="hidden_act",
            )
        hidden, num_heads = int(cfg.need("hidden_size")), int(cfg.need("num_attention_heads"))
        qkv_bias = bool(cfg.get(spec.qkv_bias_key, spec.qkv_bias_default))
        if spec.qkv_bias_key is None:
            qkv_bias = spec.qkv_bias_default
        eos = cfg.get("eos_token_id")
        moe_fields = _moe_fields(cfg, spec)
        return cls(
            architecture=spec.architecture,
            hidden_size=hidden,
            num_layers=int(cfg.need("num_hidden_layers")),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            intermediate_size=int(cfg.need("intermediate_size")),
            vocab_size=int(cfg.need("vocab_size")),
            rope_theta=_rope_theta(cfg),
            rope_scaling=_rope_scaling(cfg),
            rms_norm_eps=float(cfg.need("rms_norm_eps")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=qkv_bias and spec.o_bias_follows_qkv,
            qk_norm=spec.qk_norm,
            max_position_embeddings=int(cfg.need("max_position_embeddings")),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            sliding_window=_sliding_window(cfg, spec),
            window_layers=_window_layers(cfg, spec),
            **moe_fields,
        )


class _Reader:
    """``config.json`` lookups that fall back to the family's HF defaults."""

    def __init__(self, raw: Mapping[str, Any], spec: ArchSpec) -> None:
        self.raw, self.spec = raw, spec

    def get(self, key: str | None, default: Any = None) -> Any:
        """The value in ``config.json`` (an explicit null included), else the family default."""
        if key is None:
            return default
        if key in self.raw:
            return self.raw[key]
        return self.spec.defaults.get(key, default)

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConfigError(f"config.json lacks required key {key!r}", param=key)
        return value


def _rope_params(cfg: _Reader) -> Mapping[str, Any]:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        raise UnsupportedArchitectureError("per-layer rope parameters are not supported")
    return params


def _rope_theta(cfg: _Reader) -> float:
    return float(_rope_params(cfg).get("rope_theta") or cfg.need("rope_theta"))


def _rope_scaling(cfg: _Reader) -> RopeScaling | None:
    params = _rope_params(cfg)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES or params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedArchitectureError(
            f"rope {dict(params)!r} is not supported; supported rope types: "
            + ", ".join(SUPPORTED_ROPE_TYPES),
            param="rope_scaling",
        )
    if rope_type == "default":
        return None
    max_pos = int(cfg.need("max_position_embeddings"))
    return RopeScaling(
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings") or max_pos
        ),
    )


def _sliding_window(cfg: _Reader, spec: ArchSpec) -> int | None:
    if spec.sliding_window_needs_flag and not cfg.get("use_sliding_window", False):
        return None
    window = cfg.get("sliding_window")
    return int(window) if window else None


def _moe_fields(cfg: _Reader, spec: ArchSpec) -> dict[str, Any]:
    moe = spec.moe
    if moe is None:
        return {}
    num_experts = next((cfg.get(k) for k in moe.num_experts_keys if cfg.get(k)), None)
    if num_experts is None:
        raise ConfigError(
            f"config.json lacks the expert count ({' or '.join(moe.num_experts_keys)})",
            param=moe.num_experts_keys[0],
        )
    fields: dict[str, Any] = {
        "num_experts": int(num_experts),
        "top_k": int(cfg.need("num_experts_per_tok")),
        "moe_intermediate_size": int(cfg.need(moe.expert_intermediate_key)),
        "norm_topk_prob": moe.always_renormalize or bool(cfg.get("norm_topk_prob", False)),
    }
    if moe.has_shared_expert:
        fields["shared_expert_intermediate_size"] = int(cfg.need("shared_expert_intermediate_size"))
    if moe.honours_sparse_step:
        fields["decoder_sparse_step"] = int(cfg.get("decoder_sparse_step") or 1)
        fields["mlp_only_layers"] = tuple(int(i) for i in cfg.get("mlp_only_layers") or ())
    return fields


def _window_layers(cfg: _Reader, spec: ArchSpec) -> tuple[int, ...]:
    """The layers that slide: ``layer_types`` when given, else Qwen's ``max_window_layers``
    rule (layers from that index on), else every layer."""
    if _sliding_window(cfg, spec) is None:
        return ()
    num_layers = int(cfg.need("num_hidden_layers"))
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        return tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    if spec.sliding_window_needs_flag:
        first = int(cfg.get("max_window_layers") or 0)
        return tuple(range(first, num_layers))
    return tuple(range(num_layers))
