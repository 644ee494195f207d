"""Built-in tiny models (``builtin:tiny-llama``, ``builtin:tiny-moe``) and model resolution."""

from engine.builtin.resolve import BUILTIN_PREFIX, builtin_model_names, resolve_model

__all__ = ["BUILTIN_PREFIX", "builtin_model_names", "resolve_model"]
