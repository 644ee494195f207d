"""The kernel launches an engine makes for one configuration, planned by the launchers themselves.

For every step size the engine runs — the decode batch sizes it captures as CUDA graphs and the
chunk sizes up to its token budget — the gate builds the tensors one decoder layer hands its
kernels (on the meta device: the shapes, dtypes and strides of the real ones, no memory) and asks
each launcher's own plan function what it would launch on a target. Every choice — tile sizes,
split counts, the MoE tile table, the fp8 path — is the launcher's; nothing here picks one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton

from core.config import EngineConfig
from core.kv_layout import QUANTIZED_KV_SCALE_BYTES
from engine.attention.triton_kernels.cache_write import write_kv_launch
from engine.attention.triton_kernels.decode import paged_decode_launches
from engine.attention.triton_kernels.prefill import paged_prefill_launch
from engine.attention.triton_kernels.rope_cache_write import rope_write_kv_launch
from engine.cuda_graphs.buckets import default_batch_sizes
from engine.kernel_gate.models import GATE_MODELS, gate_model
from engine.models import ModelArchConfig
from engine.models.triton_kernels.fused_moe import fused_moe_launches
from engine.models.triton_kernels.rms_norm import rms_norm_launch
from engine.models.triton_kernels.silu_mul import silu_mul_launch
from engine.triton_launch import KernelLaunch, KernelTarget

META = torch.device("meta")
# The engine's defaults with a production-sized step budget: 8,192 tokens a step (vLLM's default
# for throughput serving) reach every row of the MoE tile table with the gate's MoE shape.
GATE_ENGINE_CONFIG = EngineConfig(max_num_batched_tokens=8192)
MODEL_DTYPES = (torch.bfloat16, torch.float16)
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")
_KV_STORAGE_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}


@dataclass(frozen=True)
class EngineCase:
    """One engine configuration: a gate model, its dtype, its KV cache dtype and whether its
    experts are int8 (``quantization: int8``; only the MoE experts run int8 in a Triton
    kernel)."""

    model: str
    dtype: torch.dtype
    kv_cache_dtype: str
    int8_weights: bool = False

    @property
    def label(self) -> str:
        """``model/dtype/kv.../w...``, for reports."""
        weights = "/int8-experts" if self.int8_weights else ""
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.model}/{dtype}/kv-{self.kv_cache_dtype}{weights}"


def gate_cases() -> list[EngineCase]:
    """Every gate model in bf16 and fp16 with each KV cache dtype; MoE models also with int8
    experts."""
    cases: list[EngineCase] = []
    for model in GATE_MODELS:
        weights = (False, True) if gate_model(model).is_moe else (False,)
        for dtype in MODEL_DTYPES:
            for kv_cache_dtype in KV_CACHE_DTYPES:
                cases.extend(EngineCase(model, dtype, kv_cache_dtype, w) for w in weights)
    return cases


def step_token_counts(engine_cfg: EngineConfig) -> tuple[int, ...]:
    """Tokens per step the gate plans for: the CUDA-graph decode batch sizes, and powers of two
    up to the step token budget (prefill chunks), the budget included."""
    counts = set(default_batch_sizes(engine_cfg.max_num_seqs))
    counts.update(2**i for i in range(engine_cfg.max_num_batched_tokens.bit_length()))
    counts.add(engine_cfg.max_num_batched_tokens)
    return tuple(sorted(c for c in counts if c <= engine_cfg.max_num_batched_tokens))


def plan_case(
    case: EngineCase, target: KernelTarget, engine_cfg: EngineConfig
) -> list[KernelLaunch]:
    """Every launch one decoder layer of ``case`` makes on ``target`` over the gate's step
    sizes."""
    layer = _LayerShapes(gate_model(case.model), case, engine_cfg)
    decode_sizes = set(default_batch_sizes(engine_cfg.max_num_seqs))
    launches: list[KernelLaunch] = []
    for num_tokens in step_token_counts(engine_cfg):
        launches.extend(layer.norms(num_tokens, target))
        launches.extend(layer.attention(num_tokens, target, decode=num_tokens in decode_sizes))
        launches.extend(layer.mlp(num_tokens, target))
    return launches


class _LayerShapes:
    """The tensors one decoder layer of a case hands its kernels, on the meta device."""

    def __init__(self, arch: ModelArchConfig, case: EngineCase, engine_cfg: EngineConfig):
        self.arch = arch
        self.case = case
        self.dtype = case.dtype
        storage_dtype = _KV_STORAGE_DTYPES.get(case.kv_cache_dtype, case.dtype)
        row = arch.head_dim
        if case.kv_cache_dtype in _KV_STORAGE_DTYPES:
            row += QUANTIZED_KV_SCALE_BYTES  # the float16 scale's bytes after the values
        # the engine's block-major storage [N, L, 2, bs, Hkv, D(+2)]; a layer is a strided view
        storage = torch.empty(
            (2, arch.num_layers, 2, engine_cfg.block_size, arch.num_kv_heads, row),
            dtype=storage_dtype,
            device=META,
        )
        self.layer_kv = storage[:, 0]
        self.table_width = triton.cdiv(arch.max_model_len, engine_cfg.block_size)

    def empty(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype or self.dtype, device=META)

    def norms(self, num_tokens: int, target: KernelTarget) -> Iterator[KernelLaunch]:
        """The input norm of the first layer (no residual yet) and the fused add + norm."""
        arch, hidden = self.arch, self.empty(num_tokens, self.arch.hidden_size)
        weight = self.empty(arch.hidden_size)
        eps = arch.rms_norm_eps
        yield rms_norm_launch(hidden, None, torch.empty_like(hidden), None, weight, eps, target)
        residual, out, summed = (torch.empty_like(hidden) for _ in range(3))
        yield rms_norm_launch(hidden, residual, out, summed, weight, eps, target)

    def attention(
        self, num_tokens: int, target: KernelTarget, *, decode: bool
    ) -> Iterator[KernelLaunch]:
        """q/k norm (Qwen3), RoPE + cache write (fused kernels) or the cache write alone, then
        prefill over a prefix and, at a decode batch size, decode."""
        arch, t = self.arch, num_tokens
        nh, nkv, d = arch.num_heads, arch.num_kv_heads, arch.head_dim
        qkv = self.empty(t, nh + 2 * nkv, d)  # the QKV projection's output, viewed per head
        q, k, v = qkv[:, :nh], qkv[:, nh : nh + nkv], qkv[:, nh + nkv :]
        if arch.qk_norm:
            weight, eps = self.empty(d), arch.rms_norm_eps
            for heads in (q, k):
                rows = heads.reshape(-1, d)  # [T * heads, D], a copy of the strided heads
                yield rms_norm_launch(rows, None, torch.empty_like(rows), None, weight, eps, target)
            q, k = self.empty(t, nh, d), self.empty(t, nkv, d)
        cos, sin = self.empty(t, 1, d), self.empty(t, 1, d)
        slots = self.empty(t, dtype=torch.int64)
        q_rotated = self.empty(t, nh, d)
        yield rope_write_kv_launch(self.layer_kv, q, k, v, cos, sin, slots, q_rotated, target)
        # without fused RoPE, k comes out of apply_rope: over q and k together, or alone
        k_rotated = self.empty(t, nkv, d) if arch.qk_norm else self.empty(t, nh + nkv, d)[:, nh:]
        yield write_kv_launch(self.layer_kv, k_rotated, v, slots, target)
        out, scale = self.empty(t, nh, d), d**-0.5
        table = self.empty(1, self.table_width, dtype=torch.int32)
        seq_lens = self.empty(1, dtype=torch.int32)
        starts = self.empty(2, dtype=torch.int32)
        yield paged_prefill_launch(
            out, q_rotated, self.layer_kv, table, seq_lens, starts, t, scale, target
        )
        if decode:
            tables = self.empty(t, self.table_width, dtype=torch.int32)
            lens = self.empty(t, dtype=torch.int32)
            yield from paged_decode_launches(
                out, q_rotated, self.layer_kv, tables, lens, scale, target
            )

    def mlp(self, num_tokens: int, target: KernelTarget) -> Iterator[KernelLaunch]:
        """SiLU * mul of a dense MLP, or the fused MoE experts (weighted, as the layer runs
        them, and unweighted, as an expert-parallel rank does)."""
        arch = self.arch
        if not arch.is_moe:
            gate_up = self.empty(num_tokens, 2 * arch.intermediate_size)
            yield silu_mul_launch(gate_up, self.empty(num_tokens, arch.intermediate_size), target)
            return
        hidden, inter, experts = arch.hidden_size, arch.moe_intermediate_size, arch.num_experts
        weights = torch.int8 if self.case.int8_weights else self.dtype
        gate_up_proj = self.empty(experts, 2 * inter, hidden, dtype=weights)
        down_proj = self.empty(experts, hidden, inter, dtype=weights)
        scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        if self.case.int8_weights:
            scales = (
                self.empty(experts, 2 * inter, dtype=torch.float32),
                self.empty(experts, hidden, dtype=torch.float32),
            )
        num_rows = num_tokens * arch.top_k
        # NOTE: the row layout is computed by torch ops on the ids' device; on the CPU (values
        # do not matter, its shapes depend on the counts alone) that is 10x faster than on meta
        local_ids = torch.zeros(num_rows, dtype=torch.int64)
        for row_weights in (self.empty(num_rows, dtype=torch.float32), None):
            _, launches = fused_moe_launches(
                self.empty(num_tokens, hidden),
                local_ids,
                arch.top_k,
                gate_up_proj,
                down_proj,
                *scales,
                row_weights,
                target,
            )
            yield from launches
