"""A first-guess prefill/decode split: how many GPUs each pool needs for the target load.

The heuristic (a roofline sketch, not a simulator; measure with ``pdserve bench`` and adjust):

1. **Decode is sized by KV memory.** ``decode_replicas = ceil(concurrency / capacity)`` where
   capacity is the replica's max concurrent requests at ``context_len`` (``capacity.py``); with
   no target concurrency, one full decode replica.
2. **Decode speed is bandwidth-bound.** One step streams the GPU's weights plus every running
   request's KV (on average ``input + output/2`` tokens each):
   ``step_s = (weights_per_gpu + batch x kv_per_token_per_gpu x avg_tokens) / (HBM x 0.8)``.
   Each step emits one token per request, so the pool finishes
   ``decode_replicas x batch / (output_len x step_s)`` requests per second.
3. **Prefill is compute-bound.** One prompt costs ``2 x active_params x input`` FLOPs for the
   matrices plus ``2 x layers x input^2 x heads x head_dim`` for causal attention, run at 50% of
   the TP group's dense bf16 peak.
4. **Prefill keeps up** with the decode pool's request rate at 80% utilization:
   ``prefill_replicas = ceil(rate x prefill_s / 0.8)``.

Both pools use the same tensor-parallel size (the one that fits the weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sizer.gpus import GpuSpec
from sizer.kv_capacity import CapacityPlan
from sizer.shape import ModelShape

PREFILL_MFU = 0.5
DECODE_BANDWIDTH_EFFICIENCY = 0.8
PREFILL_TARGET_UTILIZATION = 0.8


@dataclass(frozen=True)
class PDSplit:
    """The suggested pool sizes and the intermediate numbers behind them."""

    input_len_tokens: int
    output_len_tokens: int
    decode_batch_per_replica: float
    decode_step_s: float
    request_rate_per_s: float
    prefill_s_per_request: float
    prefill_replicas: int
    decode_replicas: int
    prefill_gpus: int
    decode_gpus: int


def prefill_flops(shape: ModelShape, input_len_tokens: int) -> float:
    """FLOPs to prefill one prompt: dense matmuls plus causal attention."""
    matmuls = 2.0 * shape.num_active_params * input_len_tokens
    attention = (
        2.0 * shape.num_layers * input_len_tokens**2 * shape.num_attention_heads * shape.head_dim
    )
    return matmuls + attention


def suggest_split(
    shape: ModelShape,
    plan: CapacityPlan,
    gpu: GpuSpec,
    context_len_tokens: int,
    output_len_tokens: int,
    target_concurrency: int | None,
) -> PDSplit:
    """Apply the module's heuristic to one capacity plan."""
    output_len = max(1, min(output_len_tokens, context_len_tokens - 1))
    input_len = context_len_tokens - output_len
    tp = plan.tensor_parallel_size
    concurrency = target_concurrency or plan.max_concurrent_requests
    decode_replicas = math.ceil(concurrency / plan.max_concurrent_requests)
    batch = concurrency / decode_replicas
    avg_tokens = input_len + output_len / 2
    step_bytes = plan.weight_bytes_per_gpu + batch * plan.kv_bytes_per_token_per_gpu * avg_tokens
    step_s = step_bytes / (gpu.hbm_tb_per_s * 1e12 * DECODE_BANDWIDTH_EFFICIENCY)
    rate = decode_replicas * batch / (output_len * step_s)
    prefill_s = prefill_flops(shape, input_len) / (tp * gpu.bf16_tflops * 1e12 * PREFILL_MFU)
    prefill_replicas = max(1, math.ceil(rate * prefill_s / PREFILL_TARGET_UTILIZATION))
    return PDSplit(
        input_len_tokens=input_len,
        output_len_tokens=output_len,
        decode_batch_per_replica=batch,
        decode_step_s=step_s,
        request_rate_per_s=rate,
        prefill_s_per_request=prefill_s,
        prefill_replicas=prefill_replicas,
        decode_replicas=decode_replicas,
        prefill_gpus=prefill_replicas * tp,
        decode_gpus=decode_replicas * tp,
    )
