"""Tile sizes of the MoE grouped GEMM, chosen per shape from a small table (no autotuning).

The shape that matters is how many rows each expert gets: ``rows_per_expert = N / E`` for N
(token, expert) rows over E local experts. Decode (a few rows per expert) is bound by streaming
the experts' weights, so it takes the smallest ``BLOCK_M`` (little padding per expert) and wide
``BLOCK_K`` loads; prefill (hundreds of rows per expert) is a real GEMM and takes the larger
tiles that reuse each weight tile across more rows. Both projections of a layer share
``BLOCK_M`` (one row layout serves both); ``BLOCK_N``/``BLOCK_K`` are clipped to the matrix.

| rows per expert | BLOCK_M | BLOCK_N | BLOCK_K | warps | stages |
|-----------------|---------|---------|---------|-------|--------|
| <= 8            | 16      | 64      | 128     | 4     | 4      |
| <= 32           | 32      | 64      | 64      | 4     | 4      |
| <= 128          | 64      | 128     | 64      | 8     | 3      |
| more            | 128     | 256     | 64      | 8     | 4      |

float32 models halve ``BLOCK_K`` (twice the bytes per element in shared memory). A thread holds
``BLOCK_M * BLOCK_N / (32 * warps)`` float32 accumulators: up to 128 where Hopper's wgmma reads
both operands from shared memory, 64 before sm_90 (mma.sync holds operand fragments in registers
too) and with int8 weights (converted in registers); the last row halves ``BLOCK_N`` there, else
it spills (the compile gate, ``engine.kernel_gate``, checks every row on sm_80, sm_90, sm_100).
The shared memory a configuration takes is what Triton 3.9 allocates (:func:`shared_bytes`, which
the gate compares with the compiler's report); smaller GPUs get fewer stages, then narrower
tiles. Under the CPU interpreter every shape takes ``BLOCK_M`` 16 and whole-matrix
``BLOCK_N``/``BLOCK_K`` tiles (fewer, larger numpy operations run faster there).
``benchmarks/moe_tiles.py`` times candidates on a GPU; on an H200 (64 experts x 768, hidden
2048, top-8, bf16, in a CUDA graph) the decode rows were within 1% of the best of 24 candidates
at 1 and 64 tokens, and the last row is the best of 16 at 4096 tokens (986 us against 1,184 us
for 128 x 128 x 64). The middle rows are untimed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class MoEGemmConfig:
    """One launch configuration of the grouped GEMM."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


#: (largest rows per expert, config), first match wins; the last entry takes the rest.
MOE_GEMM_TABLE: tuple[tuple[float, MoEGemmConfig], ...] = (
    (8, MoEGemmConfig(16, 64, 128, num_warps=4, num_stages=4)),
    (32, MoEGemmConfig(32, 64, 64, num_warps=4, num_stages=4)),
    (128, MoEGemmConfig(64, 128, 64, num_warps=8, num_stages=3)),
    (float("inf"), MoEGemmConfig(128, 256, 64, num_warps=8, num_stages=4)),
)

INTERPRETER_CONFIG = MoEGemmConfig(16, 4096, 4096, num_warps=1, num_stages=1)

TUNED_CAPABILITY = (9, 0)  # the table was timed on Hopper (an H200)
_WGMMA_CAPABILITY = (9, 0)
_WGMMA_MIN_ROWS = 64  # Triton issues wgmma for row blocks of a whole warpgroup's 64 rows
_ACCUMULATORS_WGMMA = 128  # float32 accumulators a thread may hold, operands in shared memory
_ACCUMULATORS_IN_REGISTERS = 64  # ... with operand fragments (or int8 conversions) in registers
_RESERVED_SHARED_SM90 = 1040  # barriers and scratch Triton adds from sm_90 on (1,024; 1,040 sm_100)


def moe_gemm_config(
    num_rows: int,
    num_local_experts: int,
    dtype: torch.dtype,
    *,
    interpreted: bool,
    max_shared_bytes: int | None = None,
    capability: tuple[int, int] = TUNED_CAPABILITY,
    int8_weights: bool = False,
) -> MoEGemmConfig:
    """The table's configuration for ``num_rows`` (token, expert) rows over the local experts
    on a GPU of ``capability``, with ``dtype`` activations and ``dtype`` or int8 weights: its
    accumulators within the registers, shrunk to fit ``max_shared_bytes`` of shared memory per
    program when given."""
    if interpreted:
        return INTERPRETER_CONFIG
    rows_per_expert = num_rows / max(num_local_experts, 1)
    config = next(cfg for limit, cfg in MOE_GEMM_TABLE if rows_per_expert <= limit)
    if dtype == torch.float32:
        config = replace(config, block_k=config.block_k // 2)
    budget = _ACCUMULATORS_WGMMA
    if int8_weights or not _uses_wgmma(config, capability):
        budget = _ACCUMULATORS_IN_REGISTERS
    while config.block_m * config.block_n > budget * 32 * config.num_warps and config.block_n > 16:
        config = replace(config, block_n=config.block_n // 2)
    if max_shared_bytes is not None:
        x_bytes = torch.finfo(dtype).bits // 8
        w_bytes = 1 if int8_weights else x_bytes
        config = fit_shared_memory(config, x_bytes, w_bytes, capability, max_shared_bytes)
    return config


def _uses_wgmma(config: MoEGemmConfig, capability: tuple[int, int]) -> bool:
    return capability >= _WGMMA_CAPABILITY and config.block_m >= _WGMMA_MIN_ROWS


def shared_bytes(
    config: MoEGemmConfig, x_bytes: int, w_bytes: int, capability: tuple[int, int]
) -> int:
    """Shared memory Triton 3.9 allocates for one program: an x tile and a weight tile per
    buffer, ``num_stages - 1`` buffers where the MMA waits for its operands (mma.sync) and
    ``num_stages`` where Hopper's asynchronous wgmma keeps one more in flight; with int8 weights
    on wgmma one more weight tile; from sm_90 on, Triton's barriers."""
    per_stage = (config.block_m * x_bytes + config.block_n * w_bytes) * config.block_k
    wgmma = _uses_wgmma(config, capability)
    total = per_stage * (config.num_stages if wgmma else config.num_stages - 1)
    if wgmma and w_bytes < x_bytes:
        total += config.block_n * config.block_k * w_bytes
    if capability >= _WGMMA_CAPABILITY:
        total += _RESERVED_SHARED_SM90
    return total


def fit_shared_memory(
    config: MoEGemmConfig,
    x_bytes: int,
    w_bytes: int,
    capability: tuple[int, int],
    max_shared_bytes: int,
) -> MoEGemmConfig:
    """``config`` with fewer stages (down to two), then halved ``BLOCK_N`` and ``BLOCK_K``
    (down to 16), until it fits ``max_shared_bytes``."""
    while shared_bytes(config, x_bytes, w_bytes, capability) > max_shared_bytes:
        if config.num_stages > 2:
            config = replace(config, num_stages=config.num_stages - 1)
        elif config.block_n > 16:
            config = replace(config, block_n=config.block_n // 2)
        elif config.block_k > 16:
            config = replace(config, block_k=config.block_k // 2)
        else:
            break
    return config
