"""Read a model's shape from a HF directory (``config.json`` + safetensors headers) or a preset.

``load_model_shape(name_or_path)`` accepts, in order: an existing directory (or its
``config.json``), ``builtin:NAME`` (the built-in checkpoint cached under
``core.env.cache_dir()/models/NAME``; run it once, e.g. ``pdserve generate --model builtin:NAME``,
to write it), or a preset name. Parameter counts come from the safetensors headers (exact) when
the directory holds weights, else from ``param_estimate``. No tensor is loaded.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

from core.builtin_models import builtin_dir, builtin_name
from core.errors import ConfigError, ModelNotFoundError
from sizer.model_presets import find_preset, preset_names
from sizer.param_estimate import estimate_params
from sizer.shape import WEIGHT_DTYPES, ModelShape, canonical_dtype

_HEADER_LEN_BYTES = 8


def _safetensors_params(path: Path) -> int:
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(_HEADER_LEN_BYTES))
        header = json.loads(f.read(header_len))
    return sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")


def count_checkpoint_params(model_dir: Path) -> int | None:
    """Parameters in the directory's ``*.safetensors`` files (headers only), or None if none."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    try:
        return sum(_safetensors_params(f) for f in files)
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise ConfigError(f"unreadable safetensors header in {model_dir}: {e}") from e


def _checkpoint_dtype(cfg: dict[str, Any]) -> str:
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return canonical_dtype(name, allowed=WEIGHT_DTYPES, param="torch_dtype")


def shape_from_config(cfg: dict[str, Any], name: str, num_params: int | None = None) -> ModelShape:
    """Build a shape from a parsed ``config.json``; ``num_params`` overrides the estimate."""
    cfg = {**cfg, **cfg.get("text_config", {})}
    try:
        heads = int(cfg["num_attention_heads"])
        latent = None
        if cfg.get("kv_lora_rank"):
            latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0))
        total, active = estimate_params(cfg)
        shape = ModelShape(
            name=name,
            num_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            num_params=total,
            num_active_params=active,
            max_context_tokens=int(cfg.get("max_position_embeddings", 0)) or 4096,
            mla_latent_dim=latent,
            default_dtype=_checkpoint_dtype(cfg),
            source="config.json",
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"config.json of {name} lacks a usable field: {e}") from e
    if num_params is not None:
        ratio = shape.num_active_params / shape.num_params
        shape = _with_params(shape, num_params, round(num_params * ratio))
    return shape


def _with_params(shape: ModelShape, total: int, active: int) -> ModelShape:
    return replace(shape, num_params=total, num_active_params=active, source="safetensors")


def shape_from_dir(model_dir: Path) -> ModelShape:
    """The shape of the HF checkpoint in ``model_dir``."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelNotFoundError(f"{model_dir} has no config.json", param="model")
    try:
        cfg = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {config_path}: {e}", param="model") from e
    return shape_from_config(cfg, model_dir.name, count_checkpoint_params(model_dir))


def load_model_shape(name_or_path: str) -> ModelShape:
    """Resolve a directory, ``builtin:NAME`` or preset name into a ``ModelShape``."""
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir():
        return shape_from_dir(path)
    if builtin_name(name_or_path) is not None:
        cached = builtin_dir(name_or_path)
        if not cached.is_dir():
            raise ModelNotFoundError(
                f"built-in model {name_or_path} is not cached at {cached}; write it once "
                f"(pdserve generate --model {name_or_path}) or pass its directory",
                param="model",
            )
        return shape_from_dir(cached)
    preset = find_preset(name_or_path)
    if preset is not None:
        return preset
    looks_like_path = name_or_path.startswith((".", "/", "~"))
    what = "no such directory" if looks_like_path else "unknown model (no preset or directory)"
    raise ModelNotFoundError(
        f"{what}: {name_or_path!r}; pass a model directory with config.json, builtin:NAME, "
        f"or a preset: {', '.join(preset_names())}",
        param="model",
    )
