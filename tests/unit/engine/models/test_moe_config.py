"""The grouped GEMM's tile table: chosen by rows per expert, narrower K for float32."""

from __future__ import annotations

import pytest
import torch

from engine.models.triton_kernels.moe_config import (
    INTERPRETER_CONFIG,
    MOE_GEMM_TABLE,
    moe_gemm_config,
)


@pytest.mark.parametrize(
    ("num_rows", "num_experts", "block_m"),
    [(8, 64, 16), (512, 64, 16), (513, 64, 32), (2048, 64, 32), (4096, 64, 64), (64000, 64, 128)],
)
def test_block_m_grows_with_rows_per_expert(num_rows: int, num_experts: int, block_m: int) -> None:
    config = moe_gemm_config(num_rows, num_experts, torch.bfloat16, interpreted=False)
    assert config.block_m == block_m


def test_float32_halves_block_k_and_the_interpreter_takes_its_own() -> None:
    half = moe_gemm_config(64, 8, torch.bfloat16, interpreted=False)
    full = moe_gemm_config(64, 8, torch.float32, interpreted=False)
    assert full.block_k * 2 == half.block_k and full.block_m == half.block_m
    assert moe_gemm_config(64, 8, torch.float32, interpreted=True) == INTERPRETER_CONFIG


def test_every_tile_fits_a_dot() -> None:
    for _, config in MOE_GEMM_TABLE:
        for size in (config.block_m, config.block_n, config.block_k // 2):
            assert size >= 16 and size & (size - 1) == 0
