"""Named shapes of well-known models, from their published ``config.json`` files.

Parameter counts are the published totals (embeddings included), rounded to 10M; MoE models also
carry the parameters one token activates. Lookup ignores case, an ``org/`` prefix and an
``-Instruct`` / ``-Chat`` suffix, so ``Qwen/Qwen2.5-7B-Instruct`` finds ``Qwen2.5-7B``.
"""

from __future__ import annotations

from core.errors import ModelNotFoundError
from sizer.shape import ModelShape


def _dense(
    name: str, layers: int, heads: int, kv_heads: int, params_b: float, context: int
) -> ModelShape:
    num_params = round(params_b * 1e9)
    return ModelShape(
        name=name,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=128,
        num_params=num_params,
        num_active_params=num_params,
        max_context_tokens=context,
    )


_PRESET_LIST: tuple[ModelShape, ...] = (
    _dense("Qwen2.5-7B", layers=28, heads=28, kv_heads=4, params_b=7.62, context=131072),
    _dense("Qwen2.5-32B", layers=64, heads=40, kv_heads=8, params_b=32.76, context=131072),
    _dense("Qwen2.5-72B", layers=80, heads=64, kv_heads=8, params_b=72.71, context=131072),
    _dense("Llama-3.1-8B", layers=32, heads=32, kv_heads=8, params_b=8.03, context=131072),
    _dense("Llama-3.1-70B", layers=80, heads=64, kv_heads=8, params_b=70.55, context=131072),
    _dense("Llama-3.1-405B", layers=126, heads=128, kv_heads=8, params_b=405.85, context=131072),
    _dense("Mistral-7B", layers=32, heads=32, kv_heads=8, params_b=7.25, context=32768),
    ModelShape(
        name="Mixtral-8x7B",
        num_layers=32,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        num_params=46_700_000_000,
        num_active_params=12_900_000_000,
        max_context_tokens=32768,
    ),
    # MLA: kv_lora_rank 512 + qk_rope_head_dim 64 per layer; 128 query heads of 128 (+64 rope).
    ModelShape(
        name="DeepSeek-V3",
        num_layers=61,
        num_attention_heads=128,
        num_kv_heads=128,
        head_dim=128,
        num_params=671_000_000_000,
        num_active_params=37_000_000_000,
        max_context_tokens=163840,
        mla_latent_dim=512 + 64,
    ),
)

PRESETS: dict[str, ModelShape] = {shape.name: shape for shape in _PRESET_LIST}


def _normalise(name: str) -> str:
    key = name.strip().lower().rsplit("/", 1)[-1]
    for suffix in ("-instruct", "-chat"):
        key = key.removesuffix(suffix)
    return key.replace("_", "-")


def preset_names() -> list[str]:
    """All preset names, in table order."""
    return list(PRESETS)


def find_preset(name: str) -> ModelShape | None:
    """The preset matching ``name`` (case/org/-Instruct insensitive), or None."""
    wanted = _normalise(name)
    for shape in _PRESET_LIST:
        if _normalise(shape.name) == wanted:
            return shape
    return None


def get_preset(name: str) -> ModelShape:
    """The preset matching ``name``; ModelNotFoundError listing every preset otherwise."""
    shape = find_preset(name)
    if shape is None:
        raise ModelNotFoundError(
            f"no preset named {name!r}; presets: {', '.join(preset_names())} "
            "(or pass a model directory holding config.json)",
            param="model",
        )
    return shape
