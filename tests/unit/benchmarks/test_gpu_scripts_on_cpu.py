"""The GPU benchmark scripts on a machine without CUDA: they import, refuse to run with a clear
message, and their roofline arithmetic is right on a model whose sizes are known."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_engine, gpu_moe, moe_tiles
from engine import LLM
from engine.models.triton_kernels.moe_config import moe_gemm_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
@pytest.mark.parametrize(
    "script",
    ["gpu_engine.py", "gpu_check.py", "decode_attention_timing.py", "gpu_moe.py", "moe_tiles.py"],
)
def test_scripts_refuse_to_run_without_cuda(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "needs a CUDA GPU" in done.stderr
    assert done.stdout == ""


def test_roofline_arithmetic_on_tiny_llama() -> None:
    model = LLM("builtin:tiny-llama").engine.parts.model
    # tiny-llama: vocab 320, hidden 256, 4 layers, 8 heads x 32 over 2 kv heads, MLP 512, fp32
    per_layer = 256 * 256 + 2 * 256 * 64 + 256 * 256 + 3 * 256 * 512  # q, k+v, o, MLP
    weights = 4 * (per_layer + 2 * 256) + 256 + 320 * 256  # + norms, final norm, lm_head
    weights += 256  # the embedding lookup reads one row
    assert gpu_engine.decode_bytes_per_step(model, 1000, 10) == 4 * weights + 1000 * 10
    flops = 2 * 4 * per_layer * 100 + 2 * 4 * 8 * 32 * 100**2
    assert gpu_engine.prefill_flops(model, 100) == flops


def test_active_bytes_arithmetic_on_tiny_moe() -> None:
    model = LLM("builtin:tiny-moe").engine.parts.model
    # tiny-moe: 4 layers of 8 experts (top-2) of width 256 over hidden 256, vocab 320, fp32
    all_bytes = 4 * sum(p.numel() for p in model.parameters())
    idle_experts = 4 * (8 - 2) * 3 * 256 * 256  # per layer, six of eight experts stay idle
    unread_rows = (320 - 1) * 256  # the embedding lookup reads one row
    expected = all_bytes - 4 * (idle_experts + unread_rows) + 1000 * 10
    assert gpu_moe.moe_decode_bytes_per_step(model, 1000, 10) == expected


def test_helpers() -> None:
    assert gpu_engine.leading_match([1, 2, 3], [1, 2, 4]) == 2
    assert gpu_engine.leading_match([1, 2], [1, 2, 3]) == 2
    assert gpu_engine.meets(0.4, "<=", 0.5) and not gpu_engine.meets(2.0, ">=", 3.0)
    prompts = gpu_engine.random_prompts(2, 5, 10, seed=1)
    assert len(prompts) == 2 and all(len(p) == 5 and min(p) >= 3 for p in prompts)


def test_tile_candidates_cover_the_tables_choice_per_regime() -> None:
    """The tuner times, for each regime, candidates that include the table's own tile, so its
    ``best`` can never be worse than what the engine runs."""
    for rows, experts in ((8, 64), (512, 64), (2048, 64), (32768, 64)):
        table = moe_gemm_config(rows, experts, torch.bfloat16, interpreted=False)
        assert table in moe_tiles.candidates_for(rows / experts)
