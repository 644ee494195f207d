"""KV capacity arithmetic: how many requests of a given length one GPU (or TP group) holds.

The model (stated once, used everywhere):

- weights take ``num_params x weight dtype bytes`` (or a measured ``weight_bytes``), split evenly
  over the ``tp`` GPUs of one replica;
- the KV budget of a GPU is ``(gpu_memory - weights_per_gpu) x memory_utilization``: the
  utilization applies to what is left after the weights, the rest is headroom for activations,
  CUDA context and fragmentation. (vLLM's ``gpu_memory_utilization`` is instead a fraction of
  the whole GPU; ``0.9`` here is roughly vLLM's ``0.92`` for a 7B model on 80 GB.)
- a request of ``context_len`` tokens (prompt plus generated tokens) holds
  ``ceil(context_len / block_size) x block_size`` tokens of KV (paged blocks);
- a replica holds ``floor(budget / kv_bytes_per_request_per_gpu)`` such requests at once.

Memory sizes are bytes; GB means 1e9 bytes (GPU memory is marketed that way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import KVCacheError
from core.tensor_parallel import tp_split_problem
from sizer.shape import ModelShape

DEFAULT_TABLE_CONTEXTS = (2048, 8192, 32768, 131072)
_AUTO_TP_CHOICES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class SizingInputs:
    """What the user asks about: hardware, dtypes, request length and target concurrency."""

    gpu_memory_bytes: int
    kv_dtype: str
    weight_dtype: str
    memory_utilization: float = 0.9
    weight_bytes: int | None = None
    tensor_parallel_size: int | None = None
    context_len_tokens: int = 8192
    target_concurrency: int | None = None
    block_size_tokens: int = 16
    table_context_lens: tuple[int, ...] = DEFAULT_TABLE_CONTEXTS


@dataclass(frozen=True)
class CapacityRow:
    """Capacity of one replica at one context length."""

    context_len_tokens: int
    kv_bytes_per_request: int
    max_concurrent_requests: int
    within_model_limit: bool


@dataclass(frozen=True)
class CapacityPlan:
    """The sizing answer for one model on one GPU type."""

    tensor_parallel_size: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    weight_bytes: int
    weight_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_bytes_per_request: int
    max_concurrent_requests: int
    max_concurrent_requests_per_gpu: float
    replicas_needed: int | None
    gpus_needed: int | None
    kv_bytes_for_target: int | None
    table: tuple[CapacityRow, ...]


def kv_budget_bytes(gpu_memory_bytes: int, weight_bytes_per_gpu: int, utilization: float) -> int:
    """KV bytes one GPU may fill: what the weights leave, times ``utilization``."""
    return max(0, math.floor((gpu_memory_bytes - weight_bytes_per_gpu) * utilization))


def padded_tokens(context_len_tokens: int, block_size_tokens: int) -> int:
    """Tokens of KV a request holds: its length rounded up to whole blocks."""
    return math.ceil(context_len_tokens / block_size_tokens) * block_size_tokens


def max_concurrent_requests(budget_bytes: int, kv_bytes_per_request_per_gpu: int) -> int:
    """How many requests of that size fit the budget (0 if none)."""
    return budget_bytes // kv_bytes_per_request_per_gpu


def _capacity_at(shape: ModelShape, inputs: SizingInputs, tp: int) -> tuple[int, int, int]:
    """(weight bytes per GPU, KV budget per GPU, requests of context_len per replica)."""
    total_weights = inputs.weight_bytes or shape.weight_bytes(inputs.weight_dtype)
    weights_per_gpu = math.ceil(total_weights / tp)
    budget = kv_budget_bytes(inputs.gpu_memory_bytes, weights_per_gpu, inputs.memory_utilization)
    tokens = padded_tokens(inputs.context_len_tokens, inputs.block_size_tokens)
    per_request = shape.kv_bytes_per_token(inputs.kv_dtype, tp) * tokens
    return weights_per_gpu, budget, max_concurrent_requests(budget, per_request)


def choose_tensor_parallel(shape: ModelShape, inputs: SizingInputs) -> int:
    """The given TP size, or the smallest power of two holding one request of context_len."""
    if inputs.tensor_parallel_size is not None:
        problem = _split_problem(shape, inputs.tensor_parallel_size)
        if problem is not None:
            raise KVCacheError(f"{shape.name}: {problem}")
        return inputs.tensor_parallel_size
    splits = [tp for tp in _AUTO_TP_CHOICES if _split_problem(shape, tp) is None]
    for tp in splits:
        if _capacity_at(shape, inputs, tp)[2] >= 1:
            return tp
    raise KVCacheError(
        f"{shape.name} does not fit on {splits[-1]} GPUs of {inputs.gpu_memory_bytes / 1e9:g} GB "
        f"at {inputs.context_len_tokens} tokens (its {shape.num_attention_heads} attention heads "
        f"and {shape.num_kv_heads} KV heads split over {', '.join(map(str, splits))} GPUs)"
    )


def _split_problem(shape: ModelShape, tp: int) -> str | None:
    """Why the engine would refuse ``tp`` for this model (the same rule); MLA models keep one
    latent per token and are not split by heads here."""
    if shape.mla_latent_dim is not None:
        return None
    return tp_split_problem(tp, shape.num_attention_heads, shape.num_kv_heads)


def plan_capacity(shape: ModelShape, inputs: SizingInputs) -> CapacityPlan:
    """Size ``shape`` for ``inputs``; KVCacheError if not one request fits the chosen TP size."""
    tp = choose_tensor_parallel(shape, inputs)
    weights_per_gpu, budget, capacity = _capacity_at(shape, inputs, tp)
    if capacity < 1:
        raise KVCacheError(
            f"{shape.name}: no room for one {inputs.context_len_tokens}-token request with "
            f"tp={tp} ({weights_per_gpu / 1e9:.1f} GB of weights per GPU, KV budget "
            f"{budget / 1e9:.2f} GB); raise --tp, lower --context-len or quantize"
        )
    per_gpu_token = shape.kv_bytes_per_token(inputs.kv_dtype, tp)
    rows = []
    for context in sorted({*inputs.table_context_lens, inputs.context_len_tokens}):
        tokens = padded_tokens(context, inputs.block_size_tokens)
        rows.append(
            CapacityRow(
                context_len_tokens=context,
                kv_bytes_per_request=shape.kv_bytes_per_token(inputs.kv_dtype) * tokens,
                max_concurrent_requests=max_concurrent_requests(budget, per_gpu_token * tokens),
                within_model_limit=context <= shape.max_context_tokens,
            )
        )
    replicas = None
    if inputs.target_concurrency is not None:
        replicas = math.ceil(inputs.target_concurrency / capacity)
    tokens = padded_tokens(inputs.context_len_tokens, inputs.block_size_tokens)
    return CapacityPlan(
        tensor_parallel_size=tp,
        kv_bytes_per_token=shape.kv_bytes_per_token(inputs.kv_dtype),
        kv_bytes_per_token_per_gpu=per_gpu_token,
        weight_bytes=inputs.weight_bytes or shape.weight_bytes(inputs.weight_dtype),
        weight_bytes_per_gpu=weights_per_gpu,
        kv_budget_bytes_per_gpu=budget,
        kv_bytes_per_request=shape.kv_bytes_per_token(inputs.kv_dtype) * tokens,
        max_concurrent_requests=capacity,
        max_concurrent_requests_per_gpu=capacity / tp,
        replicas_needed=replicas,
        gpus_needed=None if replicas is None else replicas * tp,
        kv_bytes_for_target=None
        if inputs.target_concurrency is None
        else inputs.target_concurrency * shape.kv_bytes_per_token(inputs.kv_dtype) * tokens,
        table=tuple(rows),
    )
