"""Which tensor-parallel sizes split a model: the one rule the engine, the sizer and the config
checks share.

Attention heads split evenly over the ranks; KV heads split evenly too, or — when there are fewer
KV heads than ranks — each is replicated on ``size / num_kv_heads`` ranks, so one of the two
counts must divide the other; the MLP width splits evenly (when known).
"""

from __future__ import annotations


def tp_split_problem(
    size: int, num_heads: int, num_kv_heads: int, intermediate_size: int | None = None
) -> str | None:
    """Why ``size`` ranks cannot split the model, naming the numbers; None when they can."""
    if size < 1:
        return f"tensor_parallel_size must be >= 1, got {size}"
    if size == 1:
        return None
    if num_heads % size:
        return f"tensor_parallel_size={size} does not divide the {num_heads} attention heads"
    if num_kv_heads % size and size % num_kv_heads:
        return (
            f"tensor_parallel_size={size} and the {num_kv_heads} KV heads: one must divide "
            "the other"
        )
    if intermediate_size is not None and intermediate_size % size:
        return f"tensor_parallel_size={size} does not divide the MLP width {intermediate_size}"
    return None
