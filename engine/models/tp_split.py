"""Whether a model's architecture splits over a tensor-parallel gang of a given size.

The check every rank runs before it builds its shard (:mod:`engine.models.tp_shard` holds the
shard itself): heads, KV heads and MLP widths must divide evenly; MoE expert widths too.
"""

from __future__ import annotations

from core.errors import ConfigError
from core.tensor_parallel import tp_split_problem
from engine.models.config import ModelArchConfig


def check_tensor_parallel(config: ModelArchConfig, size: int) -> None:
    """Raise :class:`ConfigError` naming the numbers unless ``config`` splits over ``size``
    (:func:`core.tensor_parallel.tp_split_problem`; MoE layers are not split yet)."""
    param = "tensor_parallel_size"
    problem = tp_split_problem(
        size, config.num_heads, config.num_kv_heads, config.intermediate_size
    )
    if problem is not None:
        raise ConfigError(problem, param=param)
    if size > 1 and config.is_moe:
        for name, width in (
            ("expert width", config.moe_intermediate_size),
            ("shared expert width", config.shared_expert_intermediate_size),
        ):
            if width % size:
                raise ConfigError(
                    f"tensor_parallel_size={size} does not divide the {name} {width}",
                    param=param,
                )
