"""The grouped GEMM's tile table: chosen by rows per expert, narrower K for float32, narrower N
where the accumulators would not fit the registers, fewer stages where the shared memory is
smaller."""

from __future__ import annotations

import pytest
import torch

from engine.models.triton_kernels.moe_config import (
    INTERPRETER_CONFIG,
    MOE_GEMM_TABLE,
    TUNED_CAPABILITY,
    MoEGemmConfig,
    fit_shared_memory,
    moe_gemm_config,
    shared_bytes,
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


@pytest.mark.parametrize("max_shared", [99 * 1024, 163 * 1024, 227 * 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiles_shrink_to_the_devices_shared_memory(max_shared: int, dtype: torch.dtype) -> None:
    """A tile tuned on Hopper loses stages, then width, on a GPU with less shared memory; one
    that fits is kept as it is."""
    element = torch.finfo(dtype).bits // 8
    for num_rows in (8, 512, 4096, 65536):
        table = moe_gemm_config(num_rows, 64, dtype, interpreted=False)
        fitted = moe_gemm_config(
            num_rows, 64, dtype, interpreted=False, max_shared_bytes=max_shared
        )
        assert shared_bytes(fitted, element, element, TUNED_CAPABILITY) <= max_shared
        if shared_bytes(table, element, element, TUNED_CAPABILITY) <= max_shared:
            assert fitted == table
        else:
            assert fitted.block_m == table.block_m and fitted.num_stages >= 2
            assert fitted.block_n <= table.block_n and fitted.block_k <= table.block_k


def test_prefill_tile_on_a_smaller_gpu() -> None:
    table = moe_gemm_config(65536, 64, torch.bfloat16, interpreted=False)
    assert (table.num_stages, table.block_n) == (4, 256)  # on Hopper: 4 buffers, 193 KiB
    # before sm_90 (mma.sync) Triton allocates stages - 1 buffers of 48 KiB
    fitted = fit_shared_memory(table, 2, 2, (8, 6), 99 * 1024)  # an L4 or A10: 3 stages
    assert (fitted.num_stages, fitted.block_n, fitted.block_k) == (3, 256, 64)
    narrower = fit_shared_memory(table, 2, 2, (8, 6), 40 * 1024)  # 2 stages, half the width
    assert (narrower.num_stages, narrower.block_n, narrower.block_k) == (2, 128, 64)


def test_the_largest_tile_keeps_its_accumulators_in_registers() -> None:
    """128 x 256 float32 accumulators over 8 warps are 128 a thread: fine for Hopper's wgmma,
    which reads its operands from shared memory; half the width before sm_90 and with int8
    weights (operands and conversions in registers too)."""
    rows, experts, bf16 = 65536, 64, torch.bfloat16
    assert moe_gemm_config(rows, experts, bf16, interpreted=False, capability=(9, 0)).block_n == 256
    for capability, int8 in (((8, 0), False), ((9, 0), True), ((10, 0), True)):
        config = moe_gemm_config(
            rows, experts, bf16, interpreted=False, capability=capability, int8_weights=int8
        )
        assert (config.block_m, config.block_n) == (128, 128)
    for num_rows in (8, 512, 4096):  # the smaller tiles fit everywhere as they are
        expected = moe_gemm_config(num_rows, experts, bf16, interpreted=False)
        assert expected == moe_gemm_config(
            num_rows, experts, bf16, interpreted=False, capability=(8, 0), int8_weights=True
        )


def test_shared_memory_is_counted_as_triton_allocates() -> None:
    """Checked against the compiler by the compile gate; here the arithmetic: stages - 1
    buffers with mma.sync, stages with wgmma (64-row blocks from sm_90 on), one more weight
    tile there with int8 weights, Triton's barriers from sm_90 on."""
    small = MoEGemmConfig(32, 64, 64, num_warps=4, num_stages=4)  # 12 KiB a stage in bf16
    large = MoEGemmConfig(64, 128, 64, num_warps=8, num_stages=3)  # 24 KiB a stage in bf16
    assert shared_bytes(small, 2, 2, (8, 0)) == 3 * 12288
    assert shared_bytes(small, 2, 2, (9, 0)) == 3 * 12288 + 1040
    assert shared_bytes(large, 2, 2, (8, 0)) == 2 * 24576
    assert shared_bytes(large, 2, 2, (9, 0)) == 3 * 24576 + 1040
    assert shared_bytes(large, 2, 1, (9, 0)) == 3 * 16384 + 128 * 64 + 1040
